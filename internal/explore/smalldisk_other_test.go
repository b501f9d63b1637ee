//go:build !linux

package explore

import (
	"context"
	"database/sql"
	"testing"
)

// smallDisk needs Linux's tmpfs: elsewhere the refuse class is not drawn
// on SQLite.
func smallDisk(t *testing.T) string { return "" }

func fullDisk(string, *sql.DB) func(context.Context, bool) error { return nil }
