package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/migrations"
)

// oldRun is a row written by a release before 00004, straight into the
// unpartitioned table.
type oldRun struct {
	run      claim.Run
	status   claim.Status
	attempt  int
	lease    time.Duration // lease_until - now: negative is expired
	finished time.Time     // zero: NULL
}

// snapshot renders every row of scheduler_runs, ordered by run id, as the
// server prints it: equal snapshots are equal rows, to the microsecond.
func snapshot(t *testing.T, db *sql.DB) string {
	t.Helper()
	var s sql.NullString
	err := db.QueryRowContext(t.Context(), `
SELECT string_agg(r::text, E'\n' ORDER BY r.run_id)
  FROM (SELECT run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until, finished_at
          FROM scheduler_runs) AS r`).Scan(&s)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return s.String
}

// 00004 partitions a table holding runs of every status across several
// months without losing or changing a row, keeps the fence sequence, and
// leaves runs that claims, takeovers, releases and prune handle as before;
// its Down puts every row back in one table.
func TestPartitionUpgradeKeepsEveryRun(t *testing.T) {
	ctx := t.Context()
	dsn := testenv.PostgresSchema(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.UpTo(ctx, db, migrations.Postgres, 3); err != nil {
		t.Fatal(err)
	}

	now := time.Now().UTC()
	// Months relative to today, none within prune's 48h of now: the test
	// means the same whatever day it runs.
	month := func(k int, d time.Duration) time.Time {
		return time.Date(now.Year(), now.Month()+time.Month(k), 1, 0, 0, 0, 0, time.UTC).Add(d)
	}
	ago := func(k int) time.Time { return month(k, 36*time.Hour) }
	var (
		liveRun    = claim.Run{Job: "job.live", At: now.Add(-time.Minute)}
		expiredRun = claim.Run{Job: "job.expired", At: now.Add(-2 * time.Minute)}
		interrRun  = claim.Run{Job: "job.interrupted", At: ago(-3)}
		doneRun    = claim.Run{Job: "job.done", At: ago(-6)}
		// The last microsecond of a month and, one nanosecond on, its
		// backfill rerun: two runs, one scheduled_at.
		edgeRun  = claim.Run{Job: "job.edge", At: month(-3, -time.Microsecond)}
		rerunRun = claim.Run{Job: "job.edge", At: month(-3, -time.Microsecond+time.Nanosecond)}
		farRun   = claim.Run{Job: "job.far", At: month(60, time.Hour)}
	)
	rows := []oldRun{
		{run: doneRun, status: claim.Succeeded, attempt: 1, finished: doneRun.At.Add(time.Minute)},
		{run: claim.Run{Job: "job.failed", At: ago(-6).Add(time.Hour)}, status: claim.Failed, attempt: 3, finished: ago(-6).Add(2 * time.Hour)},
		{run: claim.Run{Job: "job.skipped", At: ago(-5)}, status: claim.Skipped, attempt: 1, finished: ago(-5)},
		{run: edgeRun, status: claim.Succeeded, attempt: 1, finished: month(-3, time.Minute)},
		{run: rerunRun, status: claim.Failed, attempt: 1, finished: month(-3, 2*time.Minute)},
		{run: claim.Run{Job: "job.done", At: ago(-3).Add(time.Hour)}, status: claim.Succeeded, attempt: 2, finished: ago(-3).Add(2 * time.Hour)},
		{run: interrRun, status: claim.Interrupted, attempt: 1, lease: -time.Hour},
		{run: liveRun, status: claim.Running, attempt: 1, lease: time.Hour},
		{run: expiredRun, status: claim.Running, attempt: 2, lease: -time.Second},
		{run: farRun, status: claim.Succeeded, attempt: 1, finished: now.Add(-30 * 24 * time.Hour)},
	}
	tokens := map[string]string{}
	for i, r := range rows {
		tok := fmt.Sprintf("token-%d", i)
		tokens[r.run.ID()] = tok
		var finished *time.Time
		if !r.finished.IsZero() {
			finished = &r.finished
		}
		_, err := db.ExecContext(ctx, `
INSERT INTO scheduler_runs (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until, finished_at)
VALUES ($1, $2, $3, $4, $5, 'replica-old', nextval('scheduler_fence_seq'), $6, now() - interval '2 hours',
        now() + $7 * interval '1 microsecond', $8)`,
			r.run.ID(), r.run.Job, r.run.At, string(r.status), tok, r.attempt, r.lease.Microseconds(), finished)
		if err != nil {
			t.Fatalf("insert %s: %v", r.run.ID(), err)
		}
	}
	var fenceBefore int64
	if err := db.QueryRowContext(ctx, "SELECT last_value FROM scheduler_fence_seq").Scan(&fenceBefore); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, db)

	if err := migrations.Up(ctx, db, migrations.Postgres); err != nil {
		t.Fatalf("up: %v", err)
	}
	wantCurrent(t, db, migrations.Postgres, true)
	if got := snapshot(t, db); got != before {
		t.Fatalf("rows changed by the upgrade:\nbefore:\n%s\nafter:\n%s", before, got)
	}
	var kind string
	if err := db.QueryRowContext(ctx, "SELECT relkind FROM pg_class WHERE oid = 'scheduler_runs'::regclass").Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("scheduler_runs relkind = %q, %v; want p (partitioned)", kind, err)
	}
	// Every month with rows got its partition: the DEFAULT one is empty.
	var inDefault int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM scheduler_runs_default").Scan(&inDefault); err != nil || inDefault != 0 {
		t.Fatalf("rows in the default partition = %d, %v; want 0", inDefault, err)
	}
	var fenceAfter int64
	if err := db.QueryRowContext(ctx, "SELECT last_value FROM scheduler_fence_seq").Scan(&fenceAfter); err != nil || fenceAfter != fenceBefore {
		t.Fatalf("fence sequence at %d, %v; want %d as before the upgrade", fenceAfter, err, fenceBefore)
	}

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := postgres.New(pool, postgres.Options{Instance: "replica-new"})
	defer c.Close()
	// Upgraded in place: the rows are the point here, not the hold a new
	// process starts with (claimtest's start-hold case checks that).
	c.Settle()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	if _, err := claim.ClaimOne(cctx, c, doneRun, time.Minute); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("claim of a run done before the upgrade: %v, want ErrDone", err)
	}
	if _, err := claim.ClaimOne(cctx, c, rerunRun, time.Minute); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("claim of the rerun sharing its scheduled_at: %v, want ErrDone", err)
	}
	if _, err := claim.ClaimOne(cctx, c, liveRun, time.Minute); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("claim of a run held before the upgrade: %v, want ErrHeld", err)
	}
	for _, x := range []struct {
		run     claim.Run
		attempt int
	}{{expiredRun, 3}, {interrRun, 2}} {
		cl, err := claim.ClaimOne(cctx, c, x.run, time.Minute)
		if err != nil || cl.Attempt != x.attempt || cl.Fence <= fenceBefore {
			t.Fatalf("takeover of %s: %+v, %v; want attempt %d and a fence above %d", x.run.ID(), cl, err, x.attempt, fenceBefore)
		}
		if err := claim.ReleaseOne(cctx, c, cl, claim.Succeeded); err != nil {
			t.Fatalf("release of %s: %v", x.run.ID(), err)
		}
	}
	// The holder from before the upgrade renews and releases its claim.
	held := &claim.Claim{Run: liveRun, Token: tokens[liveRun.ID()], Holder: "replica-old"}
	if err := c.Renew(cctx, held, time.Minute); err != nil {
		t.Fatalf("renew of a claim from before the upgrade: %v", err)
	}
	if err := claim.ReleaseOne(cctx, c, held, claim.Succeeded); err != nil {
		t.Fatalf("release of a claim from before the upgrade: %v", err)
	}
	fresh, err := claim.ClaimOne(cctx, c, claim.Run{Job: "job.fresh", At: now}, time.Minute)
	if err != nil || fresh.Attempt != 1 || fresh.Fence <= fenceBefore {
		t.Fatalf("fresh claim: %+v, %v", fresh, err)
	}
	partition := func(run claim.Run) string {
		t.Helper()
		var p string
		if err := db.QueryRowContext(ctx, "SELECT tableoid::regclass::text FROM scheduler_runs WHERE run_id = $1", run.ID()).Scan(&p); err != nil {
			t.Fatalf("partition of %s: %v", run.ID(), err)
		}
		return p
	}
	if got, want := partition(fresh.Run), "scheduler_runs_p"+now.Format("2006_01"); got != want {
		t.Fatalf("fresh run went to %s, want %s", got, want)
	}

	// Prune at 48h: the three months before the interrupted one hold only
	// runs finished long ago and go whole; the interrupted run's month
	// keeps it and loses its finished run; the far month keeps its
	// partition and loses its run, finished 30 days ago.
	n, err := c.Prune(cctx, 48*time.Hour)
	if err != nil || n != 7 {
		t.Fatalf("prune = %d, %v; want 7 runs", n, err)
	}
	for k, want := range map[int]bool{-6: false, -5: false, -4: false, -3: true, 60: true} {
		name := "scheduler_runs_p" + month(k, 0).Format("2006_01")
		var exists bool
		if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil || exists != want {
			t.Errorf("partition %s exists = %v, %v; want %v", name, exists, err, want)
		}
	}
	recs, err := c.History(cctx, "", 0)
	if err != nil || len(recs) != 4 {
		t.Fatalf("history after prune: %d runs, %v; want the four taken, released or claimed since the upgrade", len(recs), err)
	}
	// A pruned run is forgotten, whole partition or not: granted again as
	// attempt 1, into the DEFAULT partition now that its month is gone.
	again, err := claim.ClaimOne(cctx, c, doneRun, time.Minute)
	if err != nil || again.Attempt != 1 {
		t.Fatalf("claim of a pruned run: %+v, %v; want attempt 1", again, err)
	}
	if got := partition(doneRun); got != "scheduler_runs_default" {
		t.Fatalf("run of a dropped month went to %s, want the default partition", got)
	}

	// Down to 00003 (00005 first, which keeps the rows as they are) and
	// up again: every row survives both ways.
	c.Close()
	pool.Close()
	before = snapshot(t, db)
	for range 2 {
		if err := migrations.Down(ctx, db, migrations.Postgres); err != nil {
			t.Fatalf("down: %v", err)
		}
	}
	if got := snapshot(t, db); got != before {
		t.Fatalf("rows changed by down:\nbefore:\n%s\nafter:\n%s", before, got)
	}
	if err := db.QueryRowContext(ctx, "SELECT relkind FROM pg_class WHERE oid = 'scheduler_runs'::regclass").Scan(&kind); err != nil || kind != "r" {
		t.Fatalf("after down, scheduler_runs relkind = %q, %v; want r (one table)", kind, err)
	}
	if err := migrations.Up(ctx, db, migrations.Postgres); err != nil {
		t.Fatalf("up after down: %v", err)
	}
	if got := snapshot(t, db); got != before {
		t.Fatalf("rows changed by up after down:\nbefore:\n%s\nafter:\n%s", before, got)
	}
}
