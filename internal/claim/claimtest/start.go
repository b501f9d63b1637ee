package claimtest

import (
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
)

// Settle ends the start hold of each of cs that has one (claim.Settler):
// they stand for replicas that have been up, and answered, for longer
// than the leases the test bids with, as every case but the start
// hold's assumes.
func Settle(cs ...claim.Claimer) {
	for _, c := range cs {
		if s, ok := c.(claim.Settler); ok {
			s.Settle()
		}
	}
}

// settled is newClaimers whose claimers are settled as they open.
func settled(newClaimers Factory) Factory {
	return func(t *testing.T) func(string) *claimers.Backend {
		open := newClaimers(t)
		return func(instance string) *claimers.Backend {
			b := open(instance)
			Settle(b.Claimer)
			return b
		}
	}
}

// startHoldCase checks that a new claimer takes no lapsed lease over
// until the backend has answered it for a lease (claim.Unanswered.Start):
// a process begun inside a stall hears its first answers as the stall
// ends, none unanswered, and a release sent into the stall by the lapsed
// lease's holder may not have landed yet.
func startHoldCase(t *testing.T, newClaimers Factory, lease time.Duration) {
	t.Run("ANewClaimerTakesNoLapsedLeaseOverUntilAnsweredForALease", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("replica-a")
		run := runAt("job.start-hold", 0)
		// A new claimer grants a run nobody holds at once: the hold
		// is for lapsed leases only.
		first := mustClaim(t, a, run, lease)
		// Wall time: the lease must lapse on the backend's clock.
		time.Sleep(time.Until(first.Deadline) + lease/2)

		b := open("replica-b")
		// Before any answer, whenever the test gets here.
		if _, ok := b.Claimer.(claim.Settler); !ok || !claim.HeldBy(b, lease) {
			t.Fatalf("a new claimer (%T) does not say it holds takeovers, or cannot settle", b.Claimer)
		}
		asked := time.Now()
		if _, err := claim.ClaimOne(ctxT(t), b, run, lease); !errors.Is(err, claim.ErrHeld) {
			t.Fatalf("a new claimer's first bid for a lapsed lease: %v, want ErrHeld (its start hold)", err)
		}
		second := takeOver(t, b, run, lease)
		if waited := time.Since(asked); waited < lease {
			t.Fatalf("a new claimer took a lapsed lease over %v after its first bid, within a lease (%v) of its first answer", waited, lease)
		}
		if second.Attempt != 2 || second.Fence <= first.Fence {
			t.Fatalf("the takeover: attempt %d fence %d, want attempt 2 and a fence above %d", second.Attempt, second.Fence, first.Fence)
		}
	})
}
