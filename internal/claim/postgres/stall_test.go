package postgres_test

import (
	"errors"
	"fmt"
	"sync"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestALeaseThatLapsedWhileTheServerWasStoppedIsNotTakenOverAtOnce: every
// process of a private server stopped (SIGSTOP) for longer than the lease
// (claimtest.LapsedInAStallIsNotTakenOver).
func TestALeaseThatLapsedWhileTheServerWasStoppedIsNotTakenOverAtOnce(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ns := backends.Prepare(t, config.ClaimerPostgres, backends.Options{Tune: func(c *config.Claimer) { c.Postgres.DSN = srv.DSN() }})
	holder, standby := ns.Open("holder"), ns.Open("standby")
	stop := func() {
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	cont := func() {
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	claimtest.LapsedInAStallIsNotTakenOver(t, holder.Claimer, standby.Claimer, stop, cont, 2*time.Second)
}

// TestABidThatWaitedInAStoppedServerDoesNotOvertakeTheRelease: a
// standby's bid, sent with time to wait into a server stopped past the
// holder's lease, waits in its socket; when the server resumes, its
// insert finds the run's row, and its takeover, sent next, found the
// lease lapsed and took the run over ahead of the holder's release,
// whose try in the stall had timed out (its retry on a fresh connection,
// or in its backoff): a finished run ran again. A bid answered later than claim.TakeoverWait holds its
// takeover back, as after a call unanswered.
func TestABidThatWaitedInAStoppedServerDoesNotOvertakeTheRelease(t *testing.T) {
	srv := testenv.StartPostgres(t)
	ns := backends.Prepare(t, config.ClaimerPostgres, backends.Options{Tune: func(c *config.Claimer) { c.Postgres.DSN = srv.DSN() }})
	holder, standby := ns.Open("holder"), ns.Open("standby")
	const lease = 2 * time.Second
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	for round, batch := range []bool{false, true} {
		finished := claim.Run{Job: "job.waited", At: at.Add(time.Duration(round) * time.Hour)}
		cl, err := claim.ClaimOne(t.Context(), holder.Claimer, finished, lease)
		if err != nil {
			t.Fatal(err)
		}
		// Connections open in the standby's pool, as a busy replica's
		// are: a bid goes out on one at once.
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				other := claim.Run{Job: "job.other", At: finished.At.Add(time.Duration(i+1) * time.Minute)}
				if _, err := claim.ClaimOne(t.Context(), standby.Claimer, other, lease); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		resumed := false
		defer func() {
			if !resumed {
				_ = srv.Resume()
			}
		}()
		// The holder's handler returns as the server stops; its release is
		// still to come (its try in the stall timed out, and its retry
		// waits out its backoff or connects anew: a timed-out statement's
		// connection is closed).
		time.Sleep(lease) // the lease lapses, on the server's clock too
		// The standby bids, with time to wait: it waits in the server
		// past a quarter lease.
		bid := make(chan error, 1)
		go func() {
			runs := []claim.Run{finished}
			if batch {
				runs = append(runs, claim.Run{Job: "job.fresh", At: finished.At})
			}
			cls, errs := standby.Claimer.Claim(t.Context(), runs, lease)
			if cls[0] != nil {
				errs[0] = fmt.Errorf("granted, attempt %d", cls[0].Attempt)
			}
			bid <- errs[0]
		}()
		time.Sleep(claim.TakeoverWait(lease) + 300*time.Millisecond)
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
		resumed = true
		if err := <-bid; !errors.Is(err, claim.ErrHeld) {
			t.Fatalf("batch %v: the standby's bid that waited in the stopped server: %v, want held", batch, err)
		}
		if err := claim.ReleaseOne(t.Context(), holder.Claimer, cl, claim.Succeeded); err != nil {
			t.Fatalf("batch %v: the holder's release, retried after the stall: %v, want landed", batch, err)
		}
		if _, err := claim.ClaimOne(t.Context(), standby.Claimer, finished, lease); !errors.Is(err, claim.ErrDone) {
			t.Fatalf("batch %v: the standby after the release: %v, want done", batch, err)
		}
	}
}

// TestATakeoverThatRunsPastItsBidsWaitHoldsBack: the takeover statement
// takes a lapsed lease over only up to its $8, the bid's insert's stamp
// plus claim.TakeoverWait: one that waited longer between the two (in a
// server stopped after the insert's answer, on a lock) writes the row
// unchanged and answers held.
func TestATakeoverThatRunsPastItsBidsWaitHoldsBack(t *testing.T) {
	ns := backends.Prepare(t, config.ClaimerPostgres, backends.Options{})
	b := ns.Open("holder")
	run := claim.Run{Job: "job.late", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	cl, err := claim.ClaimOne(t.Context(), b.Claimer, run, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(cl.Deadline) + 50*time.Millisecond) // lapsed, on the server's clock (this host's)
	take := func(by time.Time) (granted bool, status string, touched bool) {
		t.Helper()
		var (
			fence, attempt int64
			until          time.Time
		)
		if err := b.DB.QueryRowContext(t.Context(), postgres.TakeOverRun, run.ID(), claim.NewToken(), "standby",
			time.Second.Microseconds(), run.At, "{0}", false, by).Scan(&granted, &fence, &attempt, &until, &status, &touched); err != nil {
			t.Fatal(err)
		}
		return granted, status, touched
	}
	if granted, status, touched := take(time.Now().Add(-time.Millisecond)); granted || status != "running" || !touched {
		t.Fatalf("a takeover past its bid's wait: granted %v, status %q, touched %v; want held, the row written unchanged", granted, status, touched)
	}
	if granted, _, _ := take(time.Now().Add(time.Minute)); !granted {
		t.Fatal("a takeover within its bid's wait was not granted")
	}
}
