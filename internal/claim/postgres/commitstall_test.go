package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestAHistoryReadWaitsForAGrantWhoseCommitStalls: a grant is stamped by
// its statement but shown to others only when it commits. Here the
// commit of run 1 stalls for a second (a deferred trigger sleeps, as a
// synchronous standby or a slow disk would make it wait); meanwhile
// another replica is granted run 2 of the same job and reads the job's
// history, as the runner's overlap probe does before it starts run 2.
// The read must list run 1: it was stamped first, so the probe orders it
// first, and a read that missed it would let run 2 start beside it
// (docs/architecture.md, "a grant stamped before a probe read").
func TestAHistoryReadWaitsForAGrantWhoseCommitStalls(t *testing.T) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	a, b := ns.Open("replica-a"), ns.Open("replica-b")
	at := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	run1, run2 := claim.Run{Job: "job.stall", At: at}, claim.Run{Job: "job.stall", At: at.Add(time.Minute)}
	const stall = time.Second
	tag := stallCommitOf(t, a.DB, run1, stall)

	type result struct {
		cl  *claim.Claim
		err error
	}
	first := make(chan result, 1)
	go func() {
		cl, err := claim.ClaimOne(context.WithoutCancel(t.Context()), a, run1, time.Minute)
		first <- result{cl, err}
	}()
	waitForStalledCommit(t, a.DB, tag)

	second, err := claim.ClaimOne(t.Context(), b, run2, time.Minute)
	if err != nil {
		t.Fatalf("run 2, granted while run 1's commit stalls: %v", err)
	}
	hists, err := b.Histories(t.Context(), []claim.HistoryQuery{{Job: run1.Job}})
	read := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	r := <-first
	if r.err != nil {
		t.Fatalf("run 1: %v", r.err)
	}
	var seen *claim.Record
	for _, rec := range hists[0] {
		if rec.RunID == run1.ID() {
			seen = &rec
		}
	}
	if seen == nil {
		t.Fatalf("the read after run 2's grant (fence %d) lists %d runs, not run 1, whose commit stalled: %+v",
			second.Fence, len(hists[0]), hists[0])
	}
	if seen.Status != claim.Running || seen.Fence != r.cl.Fence {
		t.Fatalf("run 1 read as %+v, want running with fence %d", *seen, r.cl.Fence)
	}
	t.Logf("the read returned %v after run 1's grant was sent", read.Sub(r.cl.Requested).Round(time.Millisecond))
}

// stallCommitOf makes the commit of run's first insert sleep for d: a
// deferred constraint trigger runs at commit, after the statement has
// stamped the row and before anyone else can see it. The stalled session
// names itself with the tag it returns.
func stallCommitOf(t *testing.T, db *sql.DB, run claim.Run, d time.Duration) string {
	t.Helper()
	tag := "stalled-" + claim.NewToken()[:12]
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE FUNCTION stall_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM set_config('application_name', '%s', false); PERFORM pg_sleep(%f); RETURN NULL; END $$`, tag, d.Seconds()),
		`CREATE CONSTRAINT TRIGGER stall_commit AFTER INSERT ON scheduler_runs
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.run_id = '` + run.ID() + `') EXECUTE FUNCTION stall_commit()`,
	} {
		if _, err := db.ExecContext(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	return tag
}

// waitForStalledCommit waits until the session tagged tag sleeps in the
// trigger.
func waitForStalledCommit(t *testing.T, db *sql.DB, tag string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := db.QueryRowContext(t.Context(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND application_name = $1`, tag).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no commit ever stalled in the trigger")
		}
		time.Sleep(10 * time.Millisecond) // polling the server's view of its sessions
	}
}

// TestAHistoryReadTakesTheTableBeforeItsLocks: a grant locks the runs
// table when its statement starts and its jobs' bucket locks after; the
// history read must take them in that order too. It took its bucket
// locks first: with DDL queued on the table between them (a partition
// created, a prune), the read held a bucket lock while it waited behind
// the DDL, which waited for the grant, which waited for the bucket lock:
// every claim of that bucket stalled until PostgreSQL's deadlock check
// (deadlock_timeout, a second) reordered the queue. Found by an outside
// code review.
func TestAHistoryReadTakesTheTableBeforeItsLocks(t *testing.T) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	db := ns.Open("replica").DB
	ctx := t.Context()
	const bucket = 7
	// The grant: its statement has locked the table for writing.
	grant, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = grant.Rollback() }()
	if _, err := grant.ExecContext(ctx, "LOCK TABLE scheduler_runs IN ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	// The DDL, queued behind the grant.
	ddl, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ddlDone := make(chan error, 1)
	go func() {
		_, err := ddl.ExecContext(ctx, "LOCK TABLE scheduler_runs IN ACCESS EXCLUSIVE MODE")
		ddlDone <- err
	}()
	waitForLockWait(t, db, "AccessExclusiveLock")
	// The read, queued behind the DDL.
	readDone := make(chan error, 1)
	go func() {
		var n int
		readDone <- db.QueryRowContext(ctx, `SELECT count(*) FROM scheduler_histories(ARRAY['job.order'], ARRAY[NULL::int], ARRAY[$1::int])`, bucket).Scan(&n)
	}()
	waitForLockWait(t, db, "AccessShareLock")
	// The grant takes its bucket lock shared: nothing may hold it.
	if _, err := grant.ExecContext(ctx, "SET LOCAL lock_timeout = '500ms'"); err != nil {
		t.Fatal(err)
	}
	if _, err := grant.ExecContext(ctx, "SELECT pg_advisory_xact_lock_shared(23789, $1)", bucket); err != nil {
		t.Fatalf("the grant waited for its bucket's lock, which the read queued behind the DDL held: %v", err)
	}
	if err := grant.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-ddlDone; err != nil {
		t.Fatal(err)
	}
	if err := ddl.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
}

// waitForLockWait waits until a session waits for mode on the runs table.
func waitForLockWait(t *testing.T, db *sql.DB, mode string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_locks
			WHERE NOT granted AND mode = $1 AND relation = 'scheduler_runs'::regclass`, mode).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session ever waited for %s on the runs table", mode)
		}
		time.Sleep(10 * time.Millisecond) // polling the server's lock table
	}
}
