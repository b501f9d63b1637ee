package runner_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
	"github.com/scheduler-dev/scheduler/job"
)

// On every real backend, replicas as goroutines start each run of a
// jittered job once, at its instant plus the offset every replica hashes
// alike, never before it, and under the nominal instant's run id.
func TestJitterAcrossReplicasOnRealBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock test: 12s")
	}
	testenv.WallClock(t)
	const spec, jitter = "@every 2s", 1500 * time.Millisecond
	var all sync.WaitGroup
	defer all.Wait()
	for _, kind := range backends.Kinds {
		all.Go(func() {
			t.Run(kind, func(t *testing.T) {
				open := backends.Open(t, kind)
				led := newLedger()
				var mu sync.Mutex
				started := map[string]time.Time{} // wall clock, by run id
				sched := mustSchedule(t, spec)
				jobs := []runner.Job{{Name: "spread", Schedule: sched, Jitter: jitter,
					Handler: func(ctx context.Context, run job.Run) error {
						mu.Lock()
						defer mu.Unlock()
						started[run.ID] = time.Now()
						return nil
					}}}
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				begin := time.Now()
				for i := range 3 {
					name := fmt.Sprintf("r%d", i)
					r, err := runner.New(runner.Options{
						Claimer: led.claimer(name, open(name).Claimer), ClaimerName: kind, Instance: name,
						Lease: 2 * time.Second, MaxClockSkew: 500 * time.Millisecond, Observe: led.observer(name),
					}, jobs)
					if err != nil {
						t.Fatal(err)
					}
					wg.Go(func() { _ = r.Run(ctx) })
				}
				time.Sleep(12 * time.Second)
				end := time.Now()
				cancel()
				wg.Wait()

				var expected []claim.Run
				var widest time.Duration
				for at := sched.Next(begin.Add(time.Second)); at.Before(end.Add(-3 * time.Second)); at = sched.Next(at) {
					run := claim.Run{Job: "spread", At: at}
					expected = append(expected, run)
					if n := len(led.starts(run.ID())); n != 1 {
						t.Errorf("%s started %d times, want once", run.ID(), n)
						continue
					}
					fire := sched.Jittered("spread", at, jitter)
					widest = max(widest, fire.Sub(at))
					mu.Lock()
					s := started[run.ID()]
					mu.Unlock()
					// Claims hold back up to Lease/10 for fairness; a loaded
					// machine adds more, never a start before the offset.
					if lag := s.Sub(fire); lag < 0 || lag > time.Second {
						t.Errorf("%s started %v after its jittered start %v (offset %v), want within [0, 1s)",
							run.ID(), lag, fire.Format("15:04:05.000"), fire.Sub(at))
					}
				}
				if len(expected) < 3 {
					t.Fatalf("checked %d instants, want at least 3", len(expected))
				}
				if widest < 300*time.Millisecond {
					t.Errorf("the widest offset was %v: the jitter was not applied", widest)
				}
				led.check(t, history.Spec{Forbid: map[string]bool{"spread": true}, Expected: expected})
			})
		})
	}
}
