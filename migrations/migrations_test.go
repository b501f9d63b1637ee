package migrations_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/migrations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openDB returns a factory of *sql.DB handles on one fresh database: a
// schema of the test server for PostgreSQL, a file for SQLite.
func openDB(t *testing.T, d migrations.Dialect) func() *sql.DB {
	t.Helper()
	var driver, dsn string
	switch d {
	case migrations.SQLite:
		driver = "sqlite"
		dsn = "file:" + filepath.Join(t.TempDir(), "m.db") +
			"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	case migrations.Postgres:
		driver = "pgx"
		dsn = schemaDSN(t, testenv.PostgresDSN(t))
	}
	return func() *sql.DB {
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
}

// schemaDSN creates a private schema and returns dsn with its search_path.
func schemaDSN(t *testing.T, dsn string) string {
	t.Helper()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	if _, err := admin.ExecContext(t.Context(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := testenv.CleanupContext()
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func dialects(t *testing.T, f func(t *testing.T, d migrations.Dialect)) {
	for _, d := range []migrations.Dialect{migrations.Postgres, migrations.SQLite} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

func wantCurrent(t *testing.T, db *sql.DB, d migrations.Dialect, want bool) {
	t.Helper()
	got, err := migrations.Current(t.Context(), db, d)
	if err != nil {
		t.Fatalf("current: %v", err)
	}
	if got != want {
		t.Fatalf("current = %v, want %v", got, want)
	}
}

func TestUpDownUp(t *testing.T) {
	dialects(t, func(t *testing.T, d migrations.Dialect) {
		db := openDB(t, d)()
		ctx := t.Context()
		wantCurrent(t, db, d, false)
		if err := migrations.Up(ctx, db, d); err != nil {
			t.Fatalf("up: %v", err)
		}
		wantCurrent(t, db, d, true)
		if err := migrations.Up(ctx, db, d); err != nil {
			t.Fatalf("second up is a no-op, got: %v", err)
		}
		st, err := migrations.Status(ctx, db, d)
		if err != nil || len(st) == 0 || st[0].Name != "00001_create_runs.sql" {
			t.Fatalf("status = %v, %v; want 00001_create_runs.sql first", st, err)
		}
		for _, m := range st {
			if !m.Applied || m.AppliedAt.IsZero() {
				t.Fatalf("after up, %s", m)
			}
		}
		// Down one by one to nothing, then up again: the files are reversible.
		for range st {
			if err := migrations.Down(ctx, db, d); err != nil {
				t.Fatalf("down: %v", err)
			}
		}
		if err := migrations.Down(ctx, db, d); !errors.Is(err, migrations.ErrNoMigration) {
			t.Fatalf("down with nothing applied: %v, want ErrNoMigration", err)
		}
		wantCurrent(t, db, d, false)
		if _, err := db.ExecContext(ctx, "SELECT 1 FROM scheduler_runs"); err == nil {
			t.Fatal("scheduler_runs survived down")
		}
		if err := migrations.Up(ctx, db, d); err != nil {
			t.Fatalf("up after down: %v", err)
		}
		wantCurrent(t, db, d, true)
		if _, err := db.ExecContext(ctx, "SELECT run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until, finished_at FROM scheduler_runs"); err != nil {
			t.Fatalf("schema after up: %v", err)
		}
	})
}

// Replicas started together all migrate on start-up; every one must succeed.
func TestConcurrentUp(t *testing.T) {
	dialects(t, func(t *testing.T, d migrations.Dialect) {
		open := openDB(t, d)
		dbs := make([]*sql.DB, 4)
		for i := range dbs {
			dbs[i] = open()
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(dbs))
		for i, db := range dbs {
			wg.Go(func() {
				if err := migrations.Up(t.Context(), db, d); err != nil {
					errs <- fmt.Errorf("replica %d: %w", i, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		wantCurrent(t, dbs[0], d, true)
	})
}

// A replica that SQLite answers busy at once, without waiting out the
// busy timeout, tries again a moment later, not at once. Two processes
// opening a new file together both switch it from its rollback journal
// to WAL, which takes the file's exclusive lock, and SQLite answered one
// of them busy at once; tried again at once, every round of Up fell
// inside the other process's switch and migration, and one of two
// replicas started together failed to start, "database is locked" (an
// outside CI run). Here the busy timeout is 0, so that every conflict is
// answered at once, and another connection reads the new file, still in
// its rollback journal, for longer than Up's rounds took when they came
// at once.
func TestUpWaitsOutAnotherConnectionsLockOnANewFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	open := func(dsn string) *sql.DB {
		db, err := sql.Open("sqlite", "file:"+path+dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	other := open("?_pragma=busy_timeout(5000)") // the rollback journal
	if _, err := other.ExecContext(t.Context(), "CREATE TABLE other_process (id INTEGER)"); err != nil {
		t.Fatal(err)
	}
	tx, err := other.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(t.Context(), "SELECT count(*) FROM other_process").Scan(&n); err != nil {
		t.Fatal(err) // the read holds the file's shared lock until the commit
	}
	const held = 500 * time.Millisecond
	release := time.AfterFunc(held, func() { _ = tx.Commit() })
	defer release.Stop()
	db := open("?_pragma=busy_timeout(0)&_pragma=journal_mode(WAL)&_txlock=immediate")
	start := time.Now()
	if err := migrations.Up(t.Context(), db, migrations.SQLite); err != nil {
		t.Fatalf("up while another connection read the new file for %v: %v", held, err)
	}
	if took := time.Since(start); took < held/2 {
		t.Fatalf("up took %v while the other connection read for %v: the switch to WAL did not wait for it", took, held)
	}
	wantCurrent(t, db, migrations.SQLite, true)
}

func TestUnknownDialect(t *testing.T) {
	db := openDB(t, migrations.SQLite)()
	if err := migrations.Up(t.Context(), db, "oracle"); err == nil {
		t.Fatal("up with an unknown dialect succeeded")
	}
}

// Drops names what a rollback destroys, from the migration's own Down
// section, so that `migrate down` can say it before it does.
func TestDropsNamesWhatARollbackDestroys(t *testing.T) {
	for _, tc := range []struct {
		d    migrations.Dialect
		name string
		want string
	}{
		{migrations.Postgres, "00002_billing.sql", "[table billing_invoices table billing_usage table billing_customers]"},
		{migrations.SQLite, "00002_billing.sql", "[table billing_invoices table billing_usage table billing_customers]"},
		{migrations.Postgres, "00003_create_controls.sql", "[table scheduler_controls]"},
		{migrations.Postgres, "00005_probe_waits_for_grants.sql", "[function scheduler_histories]"},
		{migrations.SQLite, "00005_probe_waits_for_grants.sql", "[]"},
	} {
		got, err := migrations.Drops(tc.d, tc.name)
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("Drops(%s, %s) = %v, %v; want %s", tc.d, tc.name, got, err, tc.want)
		}
	}
	if _, err := migrations.Drops(migrations.Postgres, "00099_none.sql"); err == nil {
		t.Error("Drops of a migration that does not exist: no error")
	}
}
