package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConformance runs the suite on one 3-member cluster, a key prefix
// per case, one client per claimer. The lease of the expiry cases is the
// shortest the cluster grants.
func TestConformance(t *testing.T) {
	servers := testenv.EtcdEndpoints(t)
	factory := backends.Factory("etcd", backends.Options{Servers: servers})
	claimtest.Run(t, factory, claimtest.Options{Lease: testenv.EtcdLease, StartHold: true})

	// Not a contract case: a batch larger than one etcd transaction
	// carries is split, and its parts answer as one batch would.
	t.Run("BatchesSpanSeveralTransactions", func(t *testing.T) {
		t.Parallel()
		open := factory(t)
		a, b := open("replica-a"), open("replica-b")
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		const n = 250 // three transactions
		runs := make([]claim.Run, n)
		for i := range runs {
			runs[i] = claim.Run{Job: "job.big", At: base.Add(time.Duration(i) * time.Second)}
		}
		cls, errs := a.Claim(ctx, runs, time.Hour)
		fences := map[int64]bool{}
		var highest int64
		for i, err := range errs {
			if err != nil {
				t.Fatalf("run %d: %v", i, err)
			}
			if fences[cls[i].Fence] {
				t.Fatalf("run %d shares fence %d", i, cls[i].Fence)
			}
			fences[cls[i].Fence], highest = true, max(highest, cls[i].Fence)
		}
		if _, errs := b.Claim(ctx, runs, time.Hour); !every(errs, claim.ErrHeld) {
			t.Fatalf("second batch: %v, want every run held", errs)
		}
		outs := make([]claim.Status, n)
		for i := range outs {
			outs[i] = claim.Succeeded
			if i%2 == 0 {
				outs[i] = claim.Interrupted
			}
		}
		for i, err := range a.Release(ctx, cls, outs) {
			if err != nil {
				t.Fatalf("release %d: %v", i, err)
			}
		}
		again, errs := b.Claim(ctx, runs, time.Hour)
		for i, err := range errs {
			switch {
			case i%2 == 1 && !errors.Is(err, claim.ErrDone):
				t.Fatalf("run %d, released succeeded: %v, want ErrDone", i, err)
			case i%2 == 0 && (err != nil || again[i].Attempt != 2 || again[i].Fence <= highest):
				t.Fatalf("run %d, released interrupted: %+v, %v; want attempt 2 above fence %d", i, again[i], err, highest)
			}
		}
		recs, err := b.History(ctx, "job.big", 0)
		if err != nil || len(recs) != n {
			t.Fatalf("history: %d records, %v; want %d", len(recs), err, n)
		}
		for k, r := range recs {
			i := n - 1 - k
			want := cls[i].Fence
			if i%2 == 0 {
				want = again[i].Fence
			}
			if r.RunID != runs[i].ID() || r.Fence != want {
				t.Fatalf("record %d: %s fence %d, want %s fence %d", k, r.RunID, r.Fence, runs[i].ID(), want)
			}
		}
	})
}

func every(errs []error, target error) bool {
	for _, err := range errs {
		if !errors.Is(err, target) {
			return false
		}
	}
	return true
}
