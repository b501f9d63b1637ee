package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestTakeoverQueuedBehindARowLockIsStampedAfterTheWait: a takeover that
// meets the run's row locked by a write in flight (a renewal or release of
// the same run) is stamped after that write ends, not before. Other
// sessions see the grant only then, and the runner's overlap probe orders
// runs by the stamp (docs/operations.md, overlap), so a stamp from before
// the wait would date the grant earlier than anyone could have seen it.
// It holds because the claim's insert (ON CONFLICT) waits for the row's
// writer first, and the takeover statement, stamped with its own now(),
// is sent only after. The server shares this machine's clock.
// A batch (one multi-row insert, then the takeovers pipelined) does the same.
func TestTakeoverQueuedBehindARowLockIsStampedAfterTheWait(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run(fmt.Sprintf("batch of %d", batch), func(t *testing.T) { stampedAfterTheWait(t, batch) })
	}
}

func stampedAfterTheWait(t *testing.T, batch int) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	a, b := ns.Open("replica-a"), ns.Open("replica-b")
	claimtest.Settle(a, b) // replicas up for a while: no start hold
	run := claim.Run{Job: "job.stamp", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	runs := []claim.Run{run}
	for i := 1; i < batch; i++ {
		runs = append(runs, claim.Run{Job: run.Job, At: run.At.Add(time.Duration(i) * time.Minute)})
	}
	const lease = 100 * time.Millisecond
	first, err := claim.ClaimOne(t.Context(), a, run, lease)
	if err != nil {
		t.Fatal(err)
	}
	// A lease that has ended, by the server's clock; the takeover below
	// judges expiry when its statement begins.
	time.Sleep(time.Until(first.Deadline) + 50*time.Millisecond)

	tx, err := a.DB.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var locker int
	// As a renewal or release in flight would: it writes the row (a lease
	// that stays ended), so the takeover re-reads the row after the wait.
	if err := tx.QueryRowContext(t.Context(), `UPDATE scheduler_runs SET lease_until = lease_until
		WHERE run_id = $1 AND scheduled_at = $2 RETURNING pg_backend_pid()`, run.ID(), run.At).Scan(&locker); err != nil {
		t.Fatal(err)
	}
	type result struct {
		cl  *claim.Claim
		err error
	}
	done := make(chan result, 1)
	sent := time.Now()
	go func() {
		cls, errs := b.Claim(t.Context(), runs, time.Minute)
		done <- result{cls[0], errs[0]}
	}()
	// Wait until the takeover waits on the lock (the server says so),
	// then keep it waiting a while.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var waiting int
		if err := a.DB.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`,
			locker).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("takeover returned while the row was locked: %+v, %v", r.cl, r.err)
		case <-time.After(10 * time.Millisecond): // polling the server's view of its sessions
		}
		if time.Now().After(deadline) {
			t.Fatal("the takeover never waited on the row lock")
		}
	}
	time.Sleep(200 * time.Millisecond) // the wait a stamp from before it would show
	released := time.Now()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("takeover after the lock: %v", r.err)
	}
	recs, err := b.History(t.Context(), run.Job, 0)
	if err != nil || len(recs) != batch || recs[batch-1].Fence != r.cl.Fence {
		t.Fatalf("history: %+v, %v; want the takeover's record last", recs, err)
	}
	// Stamped at or after the lock went, give or take the clocks' read.
	if started := recs[batch-1].StartedAt; started.Before(released.Add(-10 * time.Millisecond)) {
		t.Fatalf("takeover stamped %v after its statement was sent, %v before the row lock it waited on was released",
			started.Sub(sent).Round(time.Millisecond), released.Sub(started).Round(time.Millisecond))
	}
}
