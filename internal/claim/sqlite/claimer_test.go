package sqlite_test

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/sqlite"
	"github.com/scheduler-dev/scheduler/migrations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	claimtest.Run(t, func(t *testing.T) func(string) claim.Claimer {
		path := migratedFile(t)
		// One *sql.DB per claimer: separate clients, as separate processes.
		return func(instance string) claim.Claimer {
			return sqlite.New(openDB(t, path), sqlite.Options{Instance: instance})
		}
	}, claimtest.Options{
		// Every commit fsyncs the WAL; on a shared disk under -race that
		// takes up to a few hundred ms, too close to the default 300ms lease
		// renewed every 100ms.
		Lease: time.Second,
	})
}

// migratedFile returns the path of a fresh, migrated database file.
func migratedFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scheduler.db")
	if err := migrations.Up(t.Context(), openDB(t, path), migrations.SQLite); err != nil {
		t.Fatal(err)
	}
	return path
}

// openDB opens path as Open would, closed when t ends.
func openDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqlite.DSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
