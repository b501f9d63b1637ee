package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// BenchmarkClaimRelease claims a fresh run and releases it as succeeded: the
// claimer's cost per executed run. Compare claims/s with BenchmarkRawInsert.
func BenchmarkClaimRelease(b *testing.B) {
	claimtest.BenchClaimRelease(b, backends.Open(b, "postgres")("bench"))
}

// BenchmarkRawInsert is the floor: one bare pgx INSERT … ON CONFLICT DO
// NOTHING RETURNING per run into a table shaped like scheduler_runs.
func BenchmarkRawInsert(b *testing.B) {
	pool, err := pgxpool.New(context.Background(), backends.Prepare(b, "postgres", backends.Options{}).Config.Postgres.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(b.Context(), `CREATE TABLE raw_runs (LIKE scheduler_runs INCLUDING ALL)`); err != nil {
		b.Fatal(err)
	}
	const insert = `
INSERT INTO raw_runs (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
VALUES ($1, 'job.bench', $2, 'running', 'token', 'bench', 1, 1, now(), now())
ON CONFLICT (run_id) DO NOTHING RETURNING fence`
	claimtest.Throughput(b, "inserts", func(b *testing.B, i int64) {
		at := base.Add(time.Duration(i) * time.Second)
		var fence int64
		if err := pool.QueryRow(b.Context(), insert, claim.Run{Job: "job.bench", At: at}.ID(), at).Scan(&fence); err != nil {
			b.Fatal(err)
		}
	})
}
