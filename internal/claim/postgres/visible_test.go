package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestHistoriesSeeEveryGrantStampedBeforeThey: a history read through
// Histories (the runner's overlap probe) that begins after a grant was
// stamped shows that grant, even where the grant's transaction commits
// long after its stamp. The probe orders runs by their stamps, so a grant
// stamped before the read but shown only after it would come first
// without having been seen, and start beside the run that read
// (docs/operations.md, overlap). A trigger stalls the grant's commit for
// a second after its statement stamped it, as a backend descheduled
// between its WAL flush and its commit's visibility would; the read must
// wait for it. Claims of one run and of a batch, fresh grants and
// takeovers alike.
func TestHistoriesSeeEveryGrantStampedBeforeThey(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run(fmt.Sprintf("batch of %d", batch), func(t *testing.T) { seenOnceStamped(t, batch) })
	}
}

func seenOnceStamped(t *testing.T, batch int) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	a, b := ns.Open("replica-a"), ns.Open("replica-b")
	run := claim.Run{Job: "job.visible", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	runs := []claim.Run{run}
	for i := 1; i < batch; i++ {
		runs = append(runs, claim.Run{Job: fmt.Sprintf("job.visible.%d", i), At: run.At})
	}
	if _, err := a.DB.ExecContext(t.Context(), `
CREATE FUNCTION stall_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.run_id = '`+run.ID()+`' AND NEW.status = 'running' THEN PERFORM pg_sleep(1); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER stall_commit AFTER INSERT OR UPDATE ON scheduler_runs FOR EACH ROW EXECUTE FUNCTION stall_commit()`); err != nil {
		t.Fatal(err)
	}
	stalled := func(claimer claim.Claimer, phase string) *claim.Claim {
		t.Helper()
		done := make(chan *claim.Claim, 1)
		go func() {
			cls, errs := claimer.Claim(context.WithoutCancel(t.Context()), runs, time.Minute)
			if errs[0] != nil {
				t.Errorf("%s: %v", phase, errs[0])
			}
			done <- cls[0]
		}()
		// Wait until the grant is stamped and its commit stalls.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var sleeping int
			if err := b.DB.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'
				AND datname = current_database() AND query NOT LIKE '%pg_stat_activity%'`).Scan(&sleeping); err != nil {
				t.Fatal(err)
			}
			if sleeping > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the grant's commit never stalled", phase)
			}
		}
		read := time.Now()
		hists, err := claim.Histories(t.Context(), b, []claim.HistoryQuery{{Job: run.Job, Limit: 16}})
		cl := <-done
		if err != nil {
			t.Fatalf("%s: histories: %v", phase, err)
		}
		if cl == nil {
			t.FailNow()
		}
		for _, r := range hists[0] {
			if r.RunID == run.ID() && r.Fence == cl.Fence && r.Status == claim.Running {
				if !r.StartedAt.Before(read) {
					t.Fatalf("%s: grant stamped %v, after the read began (%v): the case proves nothing", phase, r.StartedAt, read)
				}
				return cl
			}
		}
		t.Fatalf("%s: a read begun while the grant (fence %d, stamped before it) was committing does not show it: %+v",
			phase, cl.Fence, hists[0])
		return nil
	}
	first := stalled(a, "fresh grant")
	if err := claim.ReleaseOne(t.Context(), a, first, claim.Interrupted); err != nil {
		t.Fatal(err)
	}
	stalled(b, "takeover")
}

// TestGrantWaitingOnAProbeIsStampedAfterIt: a grant whose job a probe
// read holds locked waits for the read to end and is stamped after it,
// so it comes after the reader's run by the probe's order (the other half
// of TestHistoriesSeeEveryGrantStampedBeforeThey). Fresh grants and
// takeovers, of one run and of a batch.
func TestGrantWaitingOnAProbeIsStampedAfterIt(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run(fmt.Sprintf("batch of %d", batch), func(t *testing.T) { stampedAfterTheProbe(t, batch) })
	}
}

func stampedAfterTheProbe(t *testing.T, batch int) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	a, b := ns.Open("replica-a"), ns.Open("replica-b")
	run := claim.Run{Job: "job.probed", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	runs := []claim.Run{run}
	for i := 1; i < batch; i++ {
		runs = append(runs, claim.Run{Job: fmt.Sprintf("job.probed.%d", i), At: run.At})
	}
	behindTheProbe := func(claimer claim.Claimer, phase string) *claim.Claim {
		t.Helper()
		tx, err := a.DB.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		var locker int
		if err := tx.QueryRowContext(t.Context(), `SELECT pg_backend_pid()`).Scan(&locker); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(t.Context(), postgres.LockJobsExclusive, []string{run.Job}); err != nil {
			t.Fatal(err)
		}
		done := make(chan *claim.Claim, 1)
		go func() {
			cls, errs := claimer.Claim(context.WithoutCancel(t.Context()), runs, time.Minute)
			if errs[0] != nil {
				t.Errorf("%s: %v", phase, errs[0])
			}
			done <- cls[0]
		}()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var waiting int
			if err := b.DB.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`,
				locker).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the grant never waited on the probe's lock", phase)
			}
		}
		time.Sleep(200 * time.Millisecond) // the wait a stamp from before it would show
		released := time.Now()
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		cl := <-done
		if cl == nil {
			t.FailNow()
		}
		recs, err := b.History(t.Context(), run.Job, 1)
		if err != nil || len(recs) != 1 || recs[0].Fence != cl.Fence {
			t.Fatalf("%s: history %+v, %v; want the grant", phase, recs, err)
		}
		// Stamped at or after the lock went, give or take the clocks' read.
		if started := recs[0].StartedAt; started.Before(released.Add(-10 * time.Millisecond)) {
			t.Fatalf("%s: grant stamped %v before the probe's lock it waited on was released", phase, released.Sub(started).Round(time.Millisecond))
		}
		return cl
	}
	first := behindTheProbe(a, "fresh grant")
	if err := claim.ReleaseOne(t.Context(), a, first, claim.Interrupted); err != nil {
		t.Fatal(err)
	}
	behindTheProbe(b, "takeover")
}
