package runner_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// staleGrants returns its first n grants of runs at or after from as if the
// replica had been paused for a whole lease between sending the claim and
// reading the reply.
type staleGrants struct {
	claim.Claimer
	from time.Time
	n    atomic.Int32
}

func (s *staleGrants) Claim(ctx context.Context, runs []claim.Run, l time.Duration) ([]*claim.Claim, []error) {
	cls, errs := s.Claimer.Claim(ctx, runs, l)
	for i, r := range runs {
		if errs[i] == nil && !r.At.Before(s.from) && s.n.Add(-1) >= 0 {
			cls[i].Requested = cls[i].Requested.Add(-l)
		}
	}
	return cls, errs
}

func TestGrantPastItsTrustWindowIsHandedBackUnstarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		var ran atomic.Int32
		jobs := []runner.Job{{Name: "billing", Schedule: mustSchedule(t, "@every 1h"),
			Handler: func(ctx context.Context, run job.Run) error {
				ran.Add(1)
				return nil
			}}}
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour - 2*time.Second)))
		// a's clock is ahead, so a bids first and gets the stale grant.
		a := &replica{name: "a", skew: 500 * time.Millisecond, store: store, jobs: jobs, led: led,
			wrap: func(c claim.Claimer) claim.Claimer {
				s := &staleGrants{Claimer: c, from: time.Now()}
				s.n.Store(1)
				return s
			}}
		b := &replica{name: "b", store: store, jobs: jobs, led: led}
		a.start(t)
		b.start(t)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		a.stop()
		b.stop()

		run := claim.Run{Job: "billing", At: time.Now().Truncate(time.Hour)}
		id := run.ID()
		if s := led.starts(id); len(s) != 1 || s[0].Holder != "b" || s[0].Attempt != 2 {
			t.Fatalf("starts = %+v, want only b's attempt 2", s)
		}
		if n := ran.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want once", n)
		}
		statuses := map[string]claim.Status{}
		for _, f := range led.finishes(id) {
			statuses[f.Claim.Holder] = f.Status
		}
		if statuses["a"] != claim.LeaseLost || statuses["b"] != claim.Succeeded {
			t.Fatalf("statuses = %v, want a lease_lost (never started), b succeeded", statuses)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"billing": true}, Expected: []claim.Run{run}})
	})
}
