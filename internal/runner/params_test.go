package runner_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// Each run gets its own copy of the job's params: runs of an overlap-allow
// job writing them at once do not race (a shared map crashed a replica
// with "concurrent map writes": an outside review), and no run sees
// another's writes.
func TestEachRunHasItsOwnParams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		var seen, ran atomic.Int32
		jobs := []runner.Job{{Name: "writer", Schedule: mustSchedule(t, "@every 1s"), Overlap: runner.OverlapAllow,
			Params: job.Params{"nested": map[string]any{"n": 0}},
			Handler: func(ctx context.Context, run job.Run) error {
				ran.Add(1)
				if run.Params["last"] != nil || run.Params["nested"].(map[string]any)["n"] != 0 {
					seen.Add(1)
				}
				for i := range 15 {
					run.Params["last"] = run.ID
					run.Params["nested"].(map[string]any)["n"] = i + 1
					time.Sleep(100 * time.Millisecond)
				}
				return nil
			}}}
		r, err := runner.New(runner.Options{Claimer: memory.New(store, "a"), Instance: "a", Lease: 3 * time.Second}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		time.Sleep(4500 * time.Millisecond)
		cancel()
		<-done
		if ran.Load() < 3 {
			t.Fatalf("%d runs, want several, overlapping", ran.Load())
		}
		if n := seen.Load(); n != 0 {
			t.Errorf("%d runs began with another run's writes in their params", n)
		}
	})
}
