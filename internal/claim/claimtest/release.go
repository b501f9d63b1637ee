package claimtest

import (
	"errors"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// releaseBatchCases check that a batch release answers each claim as a
// single release would.
func releaseBatchCases(t *testing.T, newClaimers Factory, opts Options) {
	t.Run("BatchReleaseAnswersEachClaimLikeRelease", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		run := func(i int) claim.Run { return runAt("job.relbatch", i) }
		succeeded, failed, interrupted, skipped := mustClaim(t, a, run(0), longLease), mustClaim(t, a, run(1), longLease),
			mustClaim(t, a, run(2), longLease), mustClaim(t, a, run(3), longLease)
		// Released before, with the outcome the batch repeats: a retry.
		repeated := mustClaim(t, a, run(4), longLease)
		if err := claim.ReleaseOne(ctxT(t), a, repeated, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
		// Released before with another outcome.
		changed := mustClaim(t, a, run(5), longLease)
		if err := claim.ReleaseOne(ctxT(t), a, changed, claim.Failed); err != nil {
			t.Fatal(err)
		}
		// Handed back and taken over by b: a's token no longer holds it.
		taken := mustClaim(t, a, run(6), longLease)
		if err := claim.ReleaseOne(ctxT(t), a, taken, claim.Interrupted); err != nil {
			t.Fatal(err)
		}
		successor := mustClaim(t, b, run(6), longLease)
		bogus := mustClaim(t, a, run(7), longLease)

		cls := []*claim.Claim{succeeded, failed, interrupted, skipped, repeated, changed, taken, bogus}
		outs := []claim.Status{claim.Succeeded, claim.Failed, claim.Interrupted, claim.Skipped,
			claim.Succeeded, claim.Succeeded, claim.Succeeded, claim.Status("bogus")}
		errs := a.Release(ctxT(t), cls, outs)
		if len(errs) != len(cls) {
			t.Fatalf("ReleaseBatch of %d claims returned %d errors", len(cls), len(errs))
		}
		for i := range 5 {
			if errs[i] != nil {
				t.Errorf("claim %d (%s as %s): %v, want released", i, cls[i].ID(), outs[i], errs[i])
			}
		}
		wantErr(t, errs[5], claim.ErrLeaseLost, "batch release of a run released before with another outcome")
		wantErr(t, errs[6], claim.ErrLeaseLost, "batch release of a run taken over")
		wantErr(t, errs[7], claim.ErrInvalid, "batch release with an unknown outcome")

		// The batch had the effects single releases have.
		for _, i := range []int{0, 1, 3, 4} {
			_, err := claim.ClaimOne(ctxT(t), b, run(i), longLease)
			wantErr(t, err, claim.ErrDone, "claim of a run the batch released as terminal")
		}
		if again := mustClaim(t, b, run(2), longLease); again.Attempt != 2 || again.Fence <= interrupted.Fence {
			t.Fatalf("run released as interrupted by the batch was taken over as %+v; want attempt 2, fence > %d", again, interrupted.Fence)
		}
		if err := b.Renew(ctxT(t), successor, longLease); err != nil {
			t.Fatalf("the successor lost its claim to a stale batch release: %v", err)
		}
		_, err := claim.ClaimOne(ctxT(t), b, run(7), longLease)
		wantErr(t, err, claim.ErrHeld, "claim of a run whose batch release was invalid")

		if errs := a.Release(ctxT(t), nil, nil); len(errs) != 0 {
			t.Fatalf("empty batch: %v", errs)
		}
	})

	t.Run("BatchReleaseOfManyClaimsEndsEveryRun", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("replica-a"), open("replica-b")
		n := max(opts.Runs/4, 50)
		cls, outs := make([]*claim.Claim, n), make([]claim.Status, n)
		for i := range n {
			cls[i], outs[i] = mustClaim(t, a, runAt("job.relmany", i), longLease), claim.Succeeded
		}
		var failed []error
		for i, err := range a.Release(ctxT(t), cls, outs) {
			if err != nil {
				failed = append(failed, err)
			}
			if _, err := claim.ClaimOne(ctxT(t), b, cls[i].Run, longLease); !errors.Is(err, claim.ErrDone) {
				failed = append(failed, err)
			}
		}
		if len(failed) > 0 {
			t.Fatalf("%d of %d runs not released or not done afterwards; first: %v", len(failed), n, failed[0])
		}
	})
}
