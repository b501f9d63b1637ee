package explore

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/scheduler-dev/scheduler/migrations"
)

// sqliteLock stalls the SQLite file at path as another process holding
// its write lock would (a backup, a long migration, a sqlite3 shell left
// inside BEGIN EXCLUSIVE): on true a connection of its own takes the
// lock, false rolls it back. Every replica's write waits in its busy
// handler and fails at its busy timeout, nothing of it written; reads of
// the WAL go on. The claimer must then hold takeovers back as after any
// unanswered call (claim.Unanswered), so the stall is judged, not
// excused.
func sqliteLock(t *testing.T, path string) func(ctx context.Context, on bool) error {
	db, err := sql.Open("sqlite", migrations.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	var held *sql.Conn // the nemesis applies one stall at a time
	return func(ctx context.Context, on bool) error {
		if !on {
			if held == nil {
				return nil
			}
			_, err := held.ExecContext(context.Background(), "ROLLBACK")
			err = errors.Join(err, held.Close())
			held = nil
			return err
		}
		if held != nil {
			return nil
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		// It waits in the busy handler for a write in flight.
		if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
			return errors.Join(err, conn.Close())
		}
		held = conn
		return nil
	}
}
