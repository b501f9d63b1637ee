package runner_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// TestForbidHoldsBehindManyRecordedSkips: a run of an overlap-forbidden
// job outlives dozens of its instants, each recorded as skipped. A
// replica that starts then remembers none of it; the backend's history,
// read deeper past the recorded skips, still tells it the old run owns
// the job.
func TestForbidHoldsBehindManyRecordedSkips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		var running, overlaps atomic.Int32
		var first atomic.Bool
		jobs := []runner.Job{{Name: "marathon", Schedule: mustSchedule(t, "@every 1s"), Overlap: runner.OverlapForbid,
			Handler: func(ctx context.Context, run job.Run) error {
				if running.Add(1) > 1 {
					overlaps.Add(1)
				}
				defer running.Add(-1)
				d := 100 * time.Millisecond
				if first.CompareAndSwap(false, true) {
					d = 60 * time.Second // the marathon
				}
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
				return nil
			}}}
		a := &replica{name: "a", store: store, jobs: jobs, led: led, lease: 3 * time.Second}
		b := &replica{name: "b", store: store, jobs: jobs, led: led, lease: 3 * time.Second}
		a.start(t)
		b.start(t)
		time.Sleep(45 * time.Second) // 40-odd instants skipped behind the marathon
		// c runs half a second ahead (within max_clock_skew): it claims each
		// instant first, so it is the one that must find the marathon.
		c := &replica{name: "c", skew: 500 * time.Millisecond, store: store, jobs: jobs, led: led, lease: 3 * time.Second}
		c.start(t)
		time.Sleep(10 * time.Second)
		for _, rp := range []*replica{a, b, c} {
			rp.stop()
		}
		if n := overlaps.Load(); n != 0 {
			t.Errorf("%d runs of the forbidden job started while another executed", n)
		}
		if !first.Load() {
			t.Fatal("the marathon never ran")
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"marathon": true}})
	})
}
