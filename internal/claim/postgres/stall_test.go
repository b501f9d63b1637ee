package postgres_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// stoppable opens a holder and a standby on a private server and returns
// functions that stop every process of it (SIGSTOP) and continue it.
func stoppable(t *testing.T) (holder, standby *claimers.Backend, stop, cont func()) {
	t.Helper()
	srv := testenv.StartPostgres(t)
	ns := backends.Prepare(t, config.ClaimerPostgres, backends.Options{Tune: func(c *config.Claimer) { c.Postgres.DSN = srv.DSN() }})
	stop = func() {
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	cont = func() {
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	return ns.Open("holder"), ns.Open("standby"), stop, cont
}

// TestALeaseThatLapsedWhileTheServerWasStoppedIsNotTakenOverAtOnce: a
// SIGSTOP longer than the lease (claimtest.LapsedInAStallIsNotTakenOver).
func TestALeaseThatLapsedWhileTheServerWasStoppedIsNotTakenOverAtOnce(t *testing.T) {
	holder, standby, stop, cont := stoppable(t)
	claimtest.LapsedInAStallIsNotTakenOver(t, holder, standby, stop, cont, 2*time.Second)
}

// TestABidThatWaitedInAStoppedServerIsHeld: a standby's bid, sent on an
// open connection with time to wait into a server stopped past the
// holder's lease, waits in its socket; when the server resumes, its
// insert finds the run's row, and the takeover it sent next found the
// lease lapsed and took the run over ahead of the holder's release
// (claimtest.ABidThatWaitedInAStallIsHeld; docs/hardening.md entry 47).
// The bid goes in at once: a stopped server runs nothing meanwhile.
func TestABidThatWaitedInAStoppedServerIsHeld(t *testing.T) {
	holder, standby, stop, cont := stoppable(t)
	claimtest.ABidThatWaitedInAStallIsHeld(t, holder, standby, stop, cont, 2*time.Second, 0)
}

// TestAServerStoppedBrieflyAgainAndAgainHoldsTakeoversOnlyAWhile: brief
// SIGSTOPs every fraction of a lease, answers between them
// (claimtest.ChronicStallsEndTheHold).
func TestAServerStoppedBrieflyAgainAndAgainHoldsTakeoversOnlyAWhile(t *testing.T) {
	holder, standby, stop, cont := stoppable(t)
	claimtest.ChronicStallsEndTheHold(t, holder, standby, stop, cont, time.Second)
}

// TestABatchBidThatWaitedInAStoppedServerIsHeld is
// TestABidThatWaitedInAStoppedServerIsHeld through a batch's path (one
// multi-row insert, then the takeovers pipelined), and with the holder's
// release still to come as the server resumes: its try in the stall
// timed out, and its retry waits out its backoff or connects anew.
func TestABatchBidThatWaitedInAStoppedServerIsHeld(t *testing.T) {
	holder, standby, stop, cont := stoppable(t)
	const lease = 2 * time.Second
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	finished := claim.Run{Job: "job.waited", At: at}
	cl, err := claim.ClaimOne(t.Context(), holder, finished, lease)
	if err != nil {
		t.Fatal(err)
	}
	// Connections open in the standby's pool, as a busy replica's are: a
	// bid goes out on one at once.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			other := claim.Run{Job: "job.other", At: at.Add(time.Duration(i+1) * time.Minute)}
			if _, err := claim.ClaimOne(t.Context(), standby, other, lease); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	stop()
	resumed := false
	defer func() {
		if !resumed {
			cont()
		}
	}()
	time.Sleep(lease) // the lease lapses, on the server's clock too
	// The standby bids, with time to wait: it waits in the server past a
	// quarter lease.
	bid := make(chan error, 1)
	go func() {
		cls, errs := standby.Claim(t.Context(), []claim.Run{finished, {Job: "job.fresh", At: at}}, lease)
		if cls[0] != nil {
			errs[0] = fmt.Errorf("granted, attempt %d", cls[0].Attempt)
		}
		bid <- errs[0]
	}()
	time.Sleep(claim.TakeoverWait(lease) + 300*time.Millisecond)
	cont()
	resumed = true
	if err := <-bid; !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("the standby's bid that waited in the stopped server: %v, want held", err)
	}
	if err := claim.ReleaseOne(t.Context(), holder, cl, claim.Succeeded); err != nil {
		t.Fatalf("the holder's release, retried after the stall: %v, want landed", err)
	}
	if _, err := claim.ClaimOne(t.Context(), standby, finished, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("the standby after the release: %v, want done", err)
	}
}

// TestATakeoverThatRunsPastItsBidsWaitHoldsBack: the takeover statement
// takes a lapsed lease over only up to its $8 (takeoverBy: the bid's
// insert's stamp, plus the insert's round trip and claim.TakeoverWait):
// one that waited longer between the two (in a server stopped after the
// insert's answer, on a lock) writes the row unchanged and answers held.
func TestATakeoverThatRunsPastItsBidsWaitHoldsBack(t *testing.T) {
	b, run, _ := lapsedClaim(t, "job.late")
	take := func(by time.Time) (granted bool, status string, touched bool) {
		t.Helper()
		var (
			fence, attempt int64
			until          time.Time
		)
		if err := b.DB.QueryRowContext(t.Context(), postgres.TakeOverRun, run.ID(), claim.NewToken(), "standby",
			time.Second.Microseconds(), run.At, "{0}", false, by, "").Scan(&granted, &fence, &attempt, &until, &status, &touched); err != nil {
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

// TestAnUnseenGrantIsTakenWhileTakeoversAreHeld: the takeover statement
// takes a row held under the claimer's own unseen token ($9: a grant
// whose reply and hand-back were lost) even once its lease has lapsed
// and takeovers are held back ($7): the grant never started, and no
// holder's release waits to land. It is taken as the same attempt, with
// a higher fence. (The statement also keeps its touch off such a row:
// PostgreSQL leaves two writes of one row in one statement undefined,
// and here it happened to pick the take, with or without that guard.)
func TestAnUnseenGrantIsTakenWhileTakeoversAreHeld(t *testing.T) {
	b, run, cl := lapsedClaim(t, "job.unseen-held")
	var (
		granted, touched bool
		fence, attempt   int64
		until            time.Time
		status           string
	)
	if err := b.DB.QueryRowContext(t.Context(), postgres.TakeOverRun, run.ID(), claim.NewToken(), "holder",
		time.Second.Microseconds(), run.At, "{0}", true, time.Now().Add(time.Minute), cl.Token).
		Scan(&granted, &fence, &attempt, &until, &status, &touched); err != nil {
		t.Fatal(err)
	}
	if !granted || attempt != 1 || fence <= cl.Fence || touched {
		t.Fatalf("the unseen grant, lapsed, takeovers held: granted %v, attempt %d, fence %d, touched %v; want granted as attempt 1 above fence %d, untouched",
			granted, attempt, fence, touched, cl.Fence)
	}
}

// lapsedClaim claims a run of job for a replica named holder, on a
// namespace of its own, for 100ms, and returns once that lease has
// lapsed on the server's clock (this host's).
func lapsedClaim(t *testing.T, job string) (*claimers.Backend, claim.Run, *claim.Claim) {
	t.Helper()
	b := backends.Prepare(t, config.ClaimerPostgres, backends.Options{}).Open("holder")
	run := claim.Run{Job: job, At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	cl, err := claim.ClaimOne(t.Context(), b.Claimer, run, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(cl.Deadline) + 50*time.Millisecond)
	return b, run, cl
}
