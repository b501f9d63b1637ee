package sqlite_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
	"github.com/scheduler-dev/scheduler/migrations"
)

// BenchmarkClaimRelease claims a fresh run and releases it as succeeded: the
// claimer's cost per executed run. Compare claims/s with BenchmarkRawInsert.
func BenchmarkClaimRelease(b *testing.B) {
	claimtest.BenchClaimRelease(b, backends.Open(b, "sqlite")("bench"))
}

// BenchmarkRawInsert is the floor: one bare INSERT per run, autocommit, into
// a table shaped like scheduler_runs in a file opened the same way.
func BenchmarkRawInsert(b *testing.B) {
	db, err := sql.Open("sqlite", migrations.SQLiteDSN(backends.Prepare(b, "sqlite", backends.Options{}).Config.SQLite.Path))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(b.Context(), `
CREATE TABLE raw_runs (
    run_id TEXT PRIMARY KEY, job TEXT NOT NULL, scheduled_at INTEGER NOT NULL,
    status TEXT NOT NULL, token TEXT NOT NULL, holder TEXT NOT NULL, fence INTEGER NOT NULL,
    attempt INTEGER NOT NULL, started_at INTEGER NOT NULL, lease_until INTEGER NOT NULL,
    finished_at INTEGER
) STRICT, WITHOUT ROWID`); err != nil {
		b.Fatal(err)
	}
	insert, err := db.PrepareContext(b.Context(), `
INSERT INTO raw_runs (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
VALUES (?1, 'job.bench', ?2, 'running', 'token', 'bench', 1, 1, 0, 0)`)
	if err != nil {
		b.Fatal(err)
	}
	defer insert.Close()
	claimtest.Throughput(b, "inserts", func(b *testing.B, i int64) {
		at := base.Add(time.Duration(i) * time.Second)
		if _, err := insert.ExecContext(b.Context(), claim.Run{Job: "job.bench", At: at}.ID(), at.UnixMilli()); err != nil {
			b.Fatal(err)
		}
	})
}
