package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// monthStart is the first instant of the UTC month k months from now's.
func monthStart(now time.Time, k int) time.Time {
	return time.Date(now.Year(), now.Month()+time.Month(k), 1, 0, 0, 0, 0, time.UTC)
}

func partitionName(at time.Time) string { return "scheduler_runs_p" + at.UTC().Format("2006_01") }

// partitionOf names the partition that holds run's row.
func partitionOf(t *testing.T, b *claimers.Backend, run claim.Run) string {
	t.Helper()
	var p string
	err := b.DB.QueryRowContext(t.Context(), "SELECT tableoid::regclass::text FROM scheduler_runs WHERE run_id = $1 AND scheduled_at = $2",
		run.ID(), run.At).Scan(&p)
	if err != nil {
		t.Fatalf("partition of %s: %v", run.ID(), err)
	}
	return p
}

func exec(t *testing.T, b *claimers.Backend, sql string, args ...any) {
	t.Helper()
	if _, err := b.DB.ExecContext(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func exists(t *testing.T, b *claimers.Backend, table string) bool {
	t.Helper()
	var ok bool
	if err := b.DB.QueryRowContext(t.Context(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// A run whose month has no partition is claimed all the same, into the
// DEFAULT partition. The claimer's first claim starts its look at the
// months ahead: it creates the missing month's partition, the rows of
// that month move into it, and their holder renews and releases them
// there.
func TestClaimWithoutItsMonthsPartition(t *testing.T) {
	t.Parallel()
	b := backends.Open(t, "postgres")("replica-a")
	now := time.Now().UTC()
	ahead := monthStart(now, 2)
	exec(t, b, "DROP TABLE "+partitionName(ahead))
	// Claimed by another replica while the month had no partition.
	run := claim.Run{Job: "job.ahead", At: ahead.Add(time.Hour)}
	exec(t, b, `INSERT INTO scheduler_runs (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
VALUES ($1, $2, $3, 'running', 'token-b', 'replica-b', nextval('scheduler_fence_seq'), 1, now(), now() + interval '1 minute')`,
		run.ID(), run.Job, run.At)
	if got := partitionOf(t, b, run); got != "scheduler_runs_default" {
		t.Fatalf("run of a month without a partition went to %s", got)
	}

	far := claim.Run{Job: "job.far", At: monthStart(now, 120)}
	if _, err := claim.ClaimOne(t.Context(), b, far, time.Minute); err != nil {
		t.Fatalf("claim of a run whose month has no partition: %v", err)
	}
	if got := partitionOf(t, b, far); got != "scheduler_runs_default" {
		t.Fatalf("far run in %s, want the default partition", got)
	}
	for deadline := time.Now().Add(15 * time.Second); partitionOf(t, b, run) != partitionName(ahead); {
		if time.Now().After(deadline) {
			t.Fatalf("run still in %s: the claimer did not create %s", partitionOf(t, b, run), partitionName(ahead))
		}
		time.Sleep(20 * time.Millisecond) // polling the catalog; the look runs in the claimer's goroutine, with no event to wait on
	}
	held := &claim.Claim{Run: run, Token: "token-b", Holder: "replica-b"}
	if err := b.Renew(t.Context(), held, time.Minute); err != nil {
		t.Fatalf("renew after the row moved: %v", err)
	}
	if err := claim.ReleaseOne(t.Context(), b, held, claim.Succeeded); err != nil {
		t.Fatalf("release after the row moved: %v", err)
	}
	if _, err := claim.ClaimOne(t.Context(), b, run, time.Minute); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("claim of the released run: %v, want ErrDone", err)
	}
	// Every month from the current one to three ahead has a partition.
	for k := range 4 {
		if name := partitionName(monthStart(now, k)); !exists(t, b, name) {
			t.Errorf("%s missing", name)
		}
	}
}

// Prune drops a month whose runs all finished before the cutoff, and keeps
// (deleting its finished rows) a month that still holds a run a replica
// may take over; a run in the DEFAULT partition is deleted as a row.
func TestPruneDropsOnlyMonthsWithNothingToKeep(t *testing.T) {
	t.Parallel()
	b := backends.Open(t, "postgres")("replica-a")
	now := time.Now().UTC()
	gone, kept := monthStart(now, -5), monthStart(now, -4)
	exec(t, b, "SELECT scheduler_runs_create_partitions($1, $2)", gone, kept)

	type fixture struct {
		run claim.Run
		end claim.Status // "" leaves it running
	}
	far := claim.Run{Job: "job.far", At: monthStart(now, 240)}
	interrupted := claim.Run{Job: "job.b", At: kept.Add(2 * time.Hour)}
	for _, f := range []fixture{
		{claim.Run{Job: "job.a", At: gone.Add(time.Hour)}, claim.Succeeded},
		{claim.Run{Job: "job.a", At: gone.Add(2 * time.Hour)}, claim.Failed},
		{claim.Run{Job: "job.b", At: kept.Add(time.Hour)}, claim.Skipped},
		{interrupted, claim.Interrupted},
		{far, claim.Succeeded},
	} {
		cl, err := claim.ClaimOne(t.Context(), b, f.run, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.ReleaseOne(t.Context(), b, cl, f.end); err != nil {
			t.Fatal(err)
		}
	}
	if got := partitionOf(t, b, far); got != "scheduler_runs_default" {
		t.Fatalf("far run in %s, want the default partition", got)
	}
	// Finished long ago, as a run of those months would have.
	exec(t, b, "UPDATE scheduler_runs SET finished_at = now() - interval '100 days' WHERE finished_at IS NOT NULL")

	n, err := b.Pruner.Prune(t.Context(), 48*time.Hour)
	if err != nil || n != 4 {
		t.Fatalf("prune = %d, %v; want 4 runs", n, err)
	}
	if exists(t, b, partitionName(gone)) || !exists(t, b, partitionName(kept)) {
		t.Fatalf("after prune: %s exists = %v, %s exists = %v; want dropped, kept", partitionName(gone),
			exists(t, b, partitionName(gone)), partitionName(kept), exists(t, b, partitionName(kept)))
	}
	recs, err := b.History(t.Context(), "", 0)
	if err != nil || len(recs) != 1 || recs[0].RunID != interrupted.ID() {
		t.Fatalf("history after prune = %+v, %v; want the interrupted run alone", recs, err)
	}
	if cl, err := claim.ClaimOne(t.Context(), b, interrupted, time.Minute); err != nil || cl.Attempt != 2 {
		t.Fatalf("takeover of the interrupted run after prune: %+v, %v", cl, err)
	}
}

// When the lock that dropping a partition needs is not to be had (a long
// query holds the table), Prune forgets the same runs by deleting their
// rows, without waiting for it; a later prune drops the emptied month.
func TestPruneDeletesRowsWhenItCannotLock(t *testing.T) {
	t.Parallel()
	b := backends.Open(t, "postgres")("replica-a")
	now := time.Now().UTC()
	old := monthStart(now, -6)
	exec(t, b, "SELECT scheduler_runs_create_partitions($1, $1)", old)
	for i := range 3 {
		cl, err := claim.ClaimOne(t.Context(), b, claim.Run{Job: "job.old", At: old.Add(time.Duration(i) * time.Hour)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.ReleaseOne(t.Context(), b, cl, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
	}
	exec(t, b, "UPDATE scheduler_runs SET finished_at = now() - interval '100 days'")

	tx, err := b.DB.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(t.Context(), "LOCK TABLE scheduler_runs IN ACCESS SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if n, err := b.Pruner.Prune(ctx, 48*time.Hour); err != nil || n != 3 {
		t.Fatalf("prune under a reader's lock = %d, %v; want 3 runs deleted", n, err)
	}
	if !exists(t, b, partitionName(old)) {
		t.Fatal("the partition was dropped under a reader's lock")
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Pruner.Prune(ctx, 48*time.Hour); err != nil || n != 0 {
		t.Fatalf("second prune = %d, %v; want 0", n, err)
	}
	if exists(t, b, partitionName(old)) {
		t.Fatal("the emptied partition survived the second prune")
	}
}
