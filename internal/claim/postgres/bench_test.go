package postgres_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/scheduler-dev/scheduler/internal/benchkit"
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
// NOTHING RETURNING per run into a table shaped like scheduler_runs (its
// columns, indexes and key; one plain table, not partitioned).
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
ON CONFLICT (run_id, scheduled_at) DO NOTHING RETURNING fence`
	claimtest.Throughput(b, "inserts", func(b *testing.B, i int64) {
		at := base.Add(time.Duration(i) * time.Second)
		var fence int64
		if err := pool.QueryRow(b.Context(), insert, claim.Run{Job: "job.bench", At: at}.ID(), at).Scan(&fence); err != nil {
			b.Fatal(err)
		}
	})
}

// envHistoryRows turns BenchmarkClaimWithHistory on and sizes its history.
const envHistoryRows = "SCHEDULER_BENCH_HISTORY_ROWS"

// BenchmarkClaimWithHistory compares the latency of a claim (one fresh run,
// one round trip) on an empty run table with that on a table holding
// $SCHEDULER_BENCH_HISTORY_ROWS finished runs of 1,000 jobs, spread evenly
// over the two years up to now, as a ratio. The two claimers take turns,
// one claim each per iteration, first one then the other: load that comes
// and goes on a shared machine weighs on both alike.
//
// It runs only when the variable is set, and only under -bench: the
// history is generated first, server-side, into a schema of its own that
// is dropped at the end, and 50 million rows take minutes and about 20 GB.
// The figure:
//
//	SCHEDULER_BENCH_HISTORY_ROWS=50000000 go test -run '^$' -bench ClaimWithHistory \
//	    -benchtime 20000x -timeout 3h ./internal/claim/postgres/
func BenchmarkClaimWithHistory(b *testing.B) {
	rows, err := strconv.ParseInt(os.Getenv(envHistoryRows), 10, 64)
	if err != nil || rows <= 0 {
		b.Skipf("set %s (e.g. 50000000) to run it: it generates that many rows first", envHistoryRows)
	}
	empty := backends.Open(b, "postgres")("bench")
	ns := backends.Prepare(b, "postgres", backends.Options{})
	fillHistory(b, ns.Config.Postgres.DSN, rows)
	full := ns.Open("bench")

	// Runs of a job of their own from now on: the month the replicas are
	// claiming in, after its history so far.
	start := time.Now().UTC().Truncate(time.Second)
	var next int64
	b.Run("Claim", func(b *testing.B) {
		claimers := [2]claim.Claimer{empty, full}
		var lat [2][]time.Duration
		for i := 0; b.Loop(); i++ {
			next++
			run := claim.Run{Job: "bench.claim", At: start.Add(time.Duration(next) * time.Second)}
			for j := range 2 {
				k := (i + j) % 2
				t := time.Now()
				if _, err := claim.ClaimOne(b.Context(), claimers[k], run, time.Minute); err != nil {
					b.Fatal(err)
				}
				lat[k] = append(lat[k], time.Since(t))
			}
		}
		mean := func(l []time.Duration) float64 {
			var sum time.Duration
			for _, d := range l {
				sum += d
			}
			return float64(sum) / float64(len(l)) / float64(time.Microsecond)
		}
		me, mh := mean(lat[0]), mean(lat[1])
		p50e, p50h := benchkit.Percentile(lat[0], 0.50), benchkit.Percentile(lat[1], 0.50)
		p99e, p99h := benchkit.Percentile(lat[0], 0.99), benchkit.Percentile(lat[1], 0.99)
		b.ReportMetric(p50e, "empty-p50-µs")
		b.ReportMetric(p50h, "history-p50-µs")
		b.ReportMetric(p99e, "empty-p99-µs")
		b.ReportMetric(p99h, "history-p99-µs")
		b.ReportMetric(p50h/p50e, "p50-ratio")
		b.ReportMetric(p99h/p99e, "p99-ratio")
		b.ReportMetric(mh/me, "mean-ratio")
	})
}

// historyJobs is how many jobs the generated history has.
const historyJobs = 1000

// fillHistory generates rows finished runs into the run table of dsn's
// schema with INSERT … SELECT over generate_series, on the server, in
// chunks of a million: job g % 1000, instant g / 1000 steps after two
// years ago, mostly succeeded, some failed or skipped, with partitions
// for every month it covers. Then VACUUM ANALYZE, as autovacuum would
// have long since, so claims do not pay for hint bits or stale statistics,
// and a checkpoint.
func fillHistory(b *testing.B, dsn string, rows int64) {
	ctx := b.Context()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	// The namespace's own cleanup drops the schema within 10s; the
	// history's gigabytes may take longer, so they go first, unhurried.
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Errorf("drop the history: %v", err)
			return
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, `DROP TABLE scheduler_runs`); err != nil {
			b.Errorf("drop the history: %v", err)
		}
	})
	end := time.Now().UTC().Truncate(time.Second)
	begin := end.AddDate(-2, 0, 0)
	step := int64(end.Sub(begin)/time.Second) * historyJobs / rows // seconds between two runs of a job
	if step < 1 {
		b.Fatalf("%d rows do not fit two years of %d jobs at one run a second", rows, historyJobs)
	}
	const fill = `
INSERT INTO scheduler_runs (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until, finished_at)
SELECT r.job || '@' || to_char(r.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), r.job, r.at,
       CASE WHEN g % 50 = 0 THEN 'failed' WHEN g % 101 = 0 THEN 'skipped' ELSE 'succeeded' END,
       md5(g::text), 'replica-' || g % 3, g, 1, r.at, r.at + interval '30 seconds', r.at + interval '2 seconds'
  FROM generate_series($1::bigint, $2::bigint) AS g
 CROSS JOIN LATERAL (SELECT 'bench.job.' || g % $5 AS job,
                            $3::timestamptz + (g / $5) * $4 * interval '1 second' AS at) AS r`
	t0 := time.Now()
	if _, err := pool.Exec(ctx, `SELECT scheduler_runs_create_partitions($1, $2)`, begin, end); err != nil {
		b.Fatal(err)
	}
	const chunk = 1_000_000
	for lo := int64(0); lo < rows; lo += chunk {
		if _, err := pool.Exec(ctx, fill, lo, min(lo+chunk, rows)-1, begin, step, historyJobs); err != nil {
			b.Fatalf("generate rows %d…: %v", lo, err)
		}
	}
	filled := time.Since(t0)
	for _, sql := range []string{`SELECT setval('scheduler_fence_seq', ` + strconv.FormatInt(rows, 10) + `)`, `VACUUM (ANALYZE) scheduler_runs`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	// Write the generated pages out now rather than under the claims
	// measured (it needs pg_checkpoint or superuser; without, the claims
	// share the checkpoint's I/O, both tables alike).
	_, _ = pool.Exec(ctx, `CHECKPOINT`)
	var size string
	if err := pool.QueryRow(ctx, `SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits WHERE inhparent = 'scheduler_runs'::regclass`).Scan(&size); err != nil {
		b.Fatal(err)
	}
	b.Logf("history: %d rows, %s with indexes, generated in %v, vacuumed and checkpointed in %v", rows, size, filled.Round(time.Second), (time.Since(t0) - filled).Round(time.Second))
}
