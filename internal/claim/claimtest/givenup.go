package claimtest

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// GivenUpClaimsLeaveNoGhosts checks that a backend undoes the claims of
// a caller who gave up, or never makes them: many goroutines claim
// through one claimer at once, so that their calls are merged into shared
// batches, and some give up a moment after they asked, some before. Every
// run whose claim answered the caller's context error must be free for
// another replica at once, or as soon as the batch its caller left
// returns: a grant left behind would hold the run, for nobody, for a
// whole lease. Every run granted must be held, and the next claim of a
// run given up must be attempt 1: the grant undone never started.
func GivenUpClaimsLeaveNoGhosts(t *testing.T, newClaimers Factory) {
	givenUp(t, newClaimers, 0)
}

// GivenUpTakeoversLeaveNoGhosts is GivenUpClaimsLeaveNoGhosts over runs
// whose first holder's lease (of lease) has lapsed, so that every claim
// given up is a takeover: undoing one must put the run back as the
// lapsed holder left it, to be taken over at attempt 2 with a fence above
// the first holder's, not leave it held by nobody or count the undone
// takeover as an attempt.
func GivenUpTakeoversLeaveNoGhosts(t *testing.T, newClaimers Factory, lease time.Duration) {
	givenUp(t, newClaimers, lease)
}

// givenUp runs the given-up case; a lease above zero makes every claim a
// takeover of a grant of that lease, lapsed.
func givenUp(t *testing.T, newClaimers Factory, lease time.Duration) {
	newClaimers = settled(newClaimers)
	open := newClaimers(t)
	a, b := open("replica-a"), open("replica-b")
	const callers, rounds = 16, 20
	// A lone claim's time sets how soon callers give up: within three
	// of them, so that some leave before their batch goes, some while it
	// is in flight, some just after. The fastest of three: the first
	// opens connections, and a window sized by it let every claim finish
	// before its caller gave up.
	window := time.Hour
	for i := range 3 {
		start := time.Now()
		mustClaim(t, a, runAt("job.givenup.probe", i), longLease)
		window = min(window, 3*time.Since(start))
	}
	// A takeover of run must carry a fence above first[run]'s.
	first := map[claim.Run]*claim.Claim{}
	wantAttempt := 1
	if lease > 0 {
		wantAttempt = 2
		first = lapsedGrants(t, open("replica-c"), rounds*callers, lease)
	}
	type outcome struct {
		run claim.Run
		err error
	}
	var mu sync.Mutex
	var outcomes []outcome
	for r := range rounds {
		var wg sync.WaitGroup
		for g := range callers {
			wg.Go(func() {
				run := runAt("job.givenup", r*callers+g)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				switch g % 4 {
				case 1, 2:
					time.AfterFunc(rand.N(window), cancel)
				case 3:
					cancel() // gave up before it asked: a claimer in-process answers sooner than any timer
				}
				_, err := claim.ClaimOne(ctx, a, run, longLease)
				mu.Lock()
				outcomes = append(outcomes, outcome{run, err})
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	// A takeover may be held back (claim.Unanswered): the Redis
	// claimers count a call whose caller left before the reply as a call
	// the server left unanswered, and a stall may have hidden behind it.
	// A run so held back is as its lapsed holder left it.
	heldBack := lease > 0 && claim.HeldBy(a, longLease)
	gaveUp, undone, held := 0, 0, 0
	for _, o := range outcomes {
		cl, err := claim.ClaimOne(ctxT(t), b, o.run, longLease)
		switch {
		case o.err == nil:
			wantErr(t, err, claim.ErrHeld, "claim of a run granted to a caller who stayed")
			continue
		case errors.Is(o.err, context.Canceled):
			gaveUp++
			// A caller who left a batch in flight returned before it: its
			// grant is undone as the batch returns. Within seconds, then,
			// not the lease's ten minutes.
			if errors.Is(err, claim.ErrHeld) {
				undone++
				cl, err = ClaimWhenFreed(t, b, o.run, longLease)
			}
		case errors.Is(o.err, claim.ErrHeld) && heldBack:
			held++
		default:
			t.Errorf("%s: %v", o.run.ID(), o.err)
			continue
		}
		if err != nil {
			t.Errorf("%s: its caller gave up or was held back (%v), yet another replica's claim answered %v", o.run.ID(), o.err, err)
		} else if cl.Attempt != wantAttempt {
			// The grant undone never started: it spends no attempt
			// (a review found Redlock counting one when the undone
			// grant's commit had landed).
			t.Errorf("%s: its caller gave up or was held back (%v), and the next claim is attempt %d, want %d", o.run.ID(), o.err, cl.Attempt, wantAttempt)
		} else if f := first[o.run]; f != nil && cl.Fence <= f.Fence {
			t.Errorf("%s: its caller gave up or was held back (%v), and the next claim's fence %d is not above the lapsed holder's %d", o.run.ID(), o.err, cl.Fence, f.Fence)
		}
	}
	if held > 0 {
		t.Logf("%d takeovers held back after a given-up call", held)
	}
	t.Logf("%d of %d claims given up (each within %v), %d of them still held a moment later", gaveUp, len(outcomes), window, undone)
	if gaveUp == 0 {
		t.Error("no caller gave up: the case checked nothing")
	}
}

// lapsedGrants grants the case's n runs to c for lease, and returns once
// every lease has lapsed: when a probe run, granted after them for the
// same lease, can be taken over.
func lapsedGrants(t *testing.T, c claim.Claimer, n int, lease time.Duration) map[claim.Run]*claim.Claim {
	t.Helper()
	runs := make([]claim.Run, n)
	for i := range runs {
		runs[i] = runAt("job.givenup", i)
	}
	grants := make(map[claim.Run]*claim.Claim, n)
	// In slices, as the runner claims: a backend may bound its batches.
	for chunk := range slices.Chunk(runs, 64) {
		cls, errs := c.Claim(ctxT(t), chunk, lease)
		for i, run := range chunk {
			if errs[i] != nil {
				t.Fatalf("first grant of %s: %v", run.ID(), errs[i])
			}
			grants[run] = cls[i]
		}
	}
	probe := runAt("job.givenup.lapsed", 0)
	mustClaim(t, c, probe, lease)
	// Polled under the short lease: a claim of c's that waited on a
	// loaded machine may hold c's takeovers back for a lease after it
	// (claim.Unanswered), and under a long one, for the whole test.
	takeOver(t, c, probe, lease)
	return grants
}

// ClaimWhenFreed claims run through c, again and again while another
// holds it, for up to ten seconds: a grant undone or handed back on a
// goroutine of its own (a caller who gave up, a reply that was lost) is
// freed within moments, not a lease, and its landing is not observable
// from outside.
func ClaimWhenFreed(t *testing.T, c claim.Claimer, run claim.Run, lease time.Duration) (*claim.Claim, error) {
	t.Helper()
	cl, err := claim.ClaimOne(ctxT(t), c, run, lease)
	for deadline := time.Now().Add(10 * time.Second); errors.Is(err, claim.ErrHeld) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		cl, err = claim.ClaimOne(ctxT(t), c, run, lease)
	}
	return cl, err
}

// NextTryTakesItsLostGrant checks, once a claim of run through lossy was
// granted but its caller heard an error and the undo was lost, that the
// grant keeps other out, that lossy's next claim of run is granted it, at
// attempt 1, with a fence above a grant of the job made since (the lost
// grant's fence was never heard, and fences rise in grant order), and
// that the grant so taken releases like any other.
func NextTryTakesItsLostGrant(t *testing.T, lossy, other claim.Claimer, run claim.Run) {
	t.Helper()
	if _, err := claim.ClaimOne(ctxT(t), other, run, time.Minute); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("another replica's claim: %v, want held by the lost grant", err)
	}
	since := mustClaim(t, other, claim.Run{Job: run.Job, At: run.At.Add(time.Hour)}, time.Minute)
	cl, err := claim.ClaimOne(ctxT(t), lossy, run, time.Minute)
	if err != nil || cl.Attempt != 1 {
		t.Fatalf("the next try of the replica that never heard of its grant: %v, %v; want that grant, attempt 1", cl, err)
	}
	if cl.Fence <= since.Fence {
		t.Fatalf("the grant the next try took has fence %d, not above %d, a grant of its job made since", cl.Fence, since.Fence)
	}
	if err := claim.ReleaseOne(ctxT(t), lossy, cl, claim.Succeeded); err != nil {
		t.Fatalf("release of the grant the next try took: %v", err)
	}
	if _, err := claim.ClaimOne(ctxT(t), other, run, time.Minute); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("another replica after the release: %v, want done", err)
	}
}
