package claimtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// LapsedInAStallIsNotTakenOver checks a claimer's hold on takeovers after
// its backend left its calls unanswered (claim.Unanswered). holder claims
// two runs under lease; the backend stalls (stall, until resume) for
// longer than the lease, while standby's calls go unanswered, as a busy
// replica's do. When it resumes, the leases have lapsed, but their holder
// could neither renew nor release: standby is held off, and the holder's
// release lands (an outside review: 286–297 of 300 runs ran again after a
// 6–15s Redis stop, their handlers done, their releases waiting). The
// run of a holder that died meanwhile is still taken over, once standby
// has heard the backend answer for a lease.
func LapsedInAStallIsNotTakenOver(t *testing.T, holder, standby claim.Claimer, stall, resume func(), lease time.Duration) {
	t.Helper()
	Settle(holder, standby)
	finished := claim.Run{Job: "job.stalled", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	dead := claim.Run{Job: "job.stalled", At: finished.At.Add(time.Minute)}
	cls, errs := holder.Claim(ctxT(t), []claim.Run{finished, dead}, lease)
	for k, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", k, err)
		}
	}
	// What the claimer says of its hold (claim.TakeoverHolder), which the
	// runner logs and exports, is what it does.
	says := func(want bool, when string) {
		t.Helper()
		if th, ok := standby.(claim.TakeoverHolder); ok && th.TakeoversHeld(lease) != want {
			t.Errorf("%s, the standby says takeovers held: %v, want %v", when, !want, want)
		}
	}
	says(false, "before the stall")
	stall()
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	unanswered := func(run claim.Run) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
		defer cancel()
		if _, err := claim.ClaimOne(ctx, standby, run, lease); err == nil {
			t.Fatal("a claim on a stalled backend was granted")
		}
	}
	// Busy, as a replica with due runs is: its calls go unanswered from
	// the start. (One that sends nothing until its bid for a lapsed lease
	// does not know to hold back: docs/hardening.md.)
	unanswered(claim.Run{Job: "job.other", At: finished.At})
	time.Sleep(lease) // every lease lapses, by the backend's clock too
	unanswered(finished)
	resume()
	resumed = true
	says(true, "as the backend resumes")
	if _, err := claim.ClaimOne(ctxT(t), standby, finished, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("the standby's bid as the backend resumes: %v, want held: the holder may have finished", err)
	}
	if err := claim.ReleaseOne(ctxT(t), holder, cls[0], claim.Succeeded); err != nil {
		t.Fatalf("the holder's release after the stall: %v, want it to land", err)
	}
	if _, err := claim.ClaimOne(ctxT(t), standby, finished, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("the standby after the release: %v, want done", err)
	}
	cl, err := ClaimWhenFreed(t, standby, dead, lease)
	if err != nil || cl.Attempt != 2 {
		t.Fatalf("the run of a holder that died during the stall: %v, %v; want taken over, attempt 2", cl, err)
	}
	says(false, "once the dead holder's run was taken over")
}

// ChronicStallsEndTheHold checks the cap on that hold: a backend that
// stalls briefly every fraction of a lease (stall, until resume; an
// unanswered call and its undo must take well under a lease) while
// it answers in between, as a chronically overloaded one does, holds a
// lapsed lease's takeover back at first, as after any stall, but then
// lets standby take over the run of a holder that died. A hold without a
// cap kept such a run from ever executing again.
func ChronicStallsEndTheHold(t *testing.T, holder, standby claim.Claimer, stall, resume func(), lease time.Duration) {
	t.Helper()
	Settle(holder, standby)
	dead := claim.Run{Job: "job.chronic", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	claimed := time.Now() // the lease lapses after this and a lease
	if _, err := claim.ClaimOne(ctxT(t), holder, dead, lease); err != nil {
		t.Fatalf("claim: %v", err)
	}
	var first time.Time // before the standby's first call that could be answered
	limit := (claim.ChronicAfter + 8) * lease
	for i, deadline := 0, time.Now().Add(limit); ; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("a dead holder's run was not taken over in %v of brief stalls: the hold has no cap", limit)
		}
		// A brief stall, in which one of standby's calls goes unanswered.
		stall()
		ctx, cancel := context.WithTimeout(ctxT(t), 100*time.Millisecond)
		noted, _ := ctx.Deadline() // the unanswered call is noted after it
		_, err := claim.ClaimOne(ctx, standby, claim.Run{Job: "job.chronic.other", At: dead.At.Add(time.Duration(i+1) * time.Minute)}, lease)
		cancel()
		resume()
		if err == nil {
			t.Fatal("a claim on a stalled backend was granted")
		}
		sent := time.Now()
		if first.IsZero() {
			first = sent
		}
		cl, err := claim.ClaimOne(ctxT(t), standby, dead, lease)
		answered := time.Now()
		if errors.Is(err, claim.ErrHeld) {
			time.Sleep(lease / 8)
			continue
		}
		if err != nil || cl.Attempt != 2 {
			t.Fatalf("the standby's bid between stalls: %v, %v; want held, or taken over as attempt 2", cl, err)
		}
		// Taken over. Not too soon: a bid within a lease of an
		// unanswered call, early in the streak, must be held as after
		// any stall (measured from the calls' own edges, so that a
		// stalled test machine cannot make it look early).
		if answered.Sub(noted) < lease && answered.Sub(first) < (claim.ChronicAfter-1)*lease {
			t.Fatalf("taken over %v after an unanswered call, %v into the streak: the hold did not hold",
				answered.Sub(noted), answered.Sub(first))
		}
		if answered.Before(claimed.Add(lease)) {
			t.Fatalf("taken over %v before the lease lapsed", claimed.Add(lease).Sub(answered))
		}
		return
	}
}

// ABidThatWaitedInAStallIsHeld checks the other half of that hold: a
// standby whose calls were all answered until its bid went into a stall
// (stall, until resume) does not take a lease that lapsed meanwhile
// over when the backend runs the bid at last, nor with a bid right
// after: the holder's release, which waited in the stall too, lands
// first (an outside review: 1 of 300 runs ran twice after a 15s Redis
// stop, its standby's bid sent into the stall). The bid goes bidAfter
// into the stall: at once where the backend runs nothing meanwhile, as a
// stopped or paused Redis (a claimer's own calls in the background go
// unanswered later in the stall, and would hold the bid back for
// another reason); once the lease lapsed where the backend's reads go on
// answering, as SQLite's (it answers held from a read before then).
// lease must be well under the time a claim call may wait.
func ABidThatWaitedInAStallIsHeld(t *testing.T, holder, standby claim.Claimer, stall, resume func(), lease, bidAfter time.Duration) {
	t.Helper()
	bidThatWaited(t, holder, standby, stall, resume, lease, bidAfter, false)
}

// ABatchBidThatWaitedInAStallIsHeld is ABidThatWaitedInAStallIsHeld with
// the standby's bid in a batch, beside a fresh run: the runner's path when
// several runs fall due at once, which every claimer sends otherwise (a
// multi-row insert, a pipeline of scripts, one transaction). PostgreSQL's
// took a lapsed lease over there too (docs/hardening.md entry 47).
func ABatchBidThatWaitedInAStallIsHeld(t *testing.T, holder, standby claim.Claimer, stall, resume func(), lease, bidAfter time.Duration) {
	t.Helper()
	bidThatWaited(t, holder, standby, stall, resume, lease, bidAfter, true)
}

func bidThatWaited(t *testing.T, holder, standby claim.Claimer, stall, resume func(), lease, bidAfter time.Duration, batch bool) {
	t.Helper()
	Settle(holder, standby)
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	// The standby's calls are answered, as a replica's usually are.
	warm, err := claim.ClaimOne(ctxT(t), standby, claim.Run{Job: "job.waited.warm", At: at}, lease)
	if err != nil {
		t.Fatalf("warm-up claim: %v", err)
	}
	if err := claim.ReleaseOne(ctxT(t), standby, warm, claim.Succeeded); err != nil {
		t.Fatalf("warm-up release: %v", err)
	}
	run := claim.Run{Job: "job.waited", At: at}
	cl, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	stall()
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	time.Sleep(bidAfter)
	bid := make(chan error, 1)
	go func() {
		if !batch {
			_, err := claim.ClaimOne(ctxT(t), standby, run, lease)
			bid <- err
			return
		}
		cls, errs := standby.Claim(ctxT(t), []claim.Run{run, {Job: "job.waited.fresh", At: at}}, lease)
		if errs[0] == nil && cls[0] == nil {
			errs[0] = errors.New("neither granted nor refused")
		}
		bid <- errs[0]
	}()
	// The lease lapses while the bid waits, three quarters of a lease
	// after that: a bid that waited over a quarter is held, and a test
	// machine that starts the bid's goroutine late has half a lease.
	time.Sleep(max(lease+lease/4-bidAfter, 0) + 3*lease/4)
	resume()
	resumed = true
	if err := <-bid; err == nil {
		t.Fatal("the bid that waited in the stall took over a lease that lapsed meanwhile: the holder may have finished")
	}
	if _, err := claim.ClaimOne(ctxT(t), standby, run, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("the standby's next bid as the backend resumes: %v, want held: the holder may have finished", err)
	}
	if err := claim.ReleaseOne(ctxT(t), holder, cl, claim.Succeeded); err != nil {
		t.Fatalf("the holder's release after the stall: %v, want it to land", err)
	}
	if _, err := claim.ClaimOne(ctxT(t), standby, run, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("the standby after the release: %v, want done", err)
	}
}
