package runner_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// A backfill of 100 instants, half of them already run, runs exactly the
// other half, once, however many backfills race; --rerun failed then
// reruns the failed ones under their own run ids, and a missed instant
// (it never started) is run by any backfill.
func TestBackfillRunsExactlyTheInstantsThatNeverRan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		var mu sync.Mutex
		ran := map[string]int{}
		jobs := []runner.Job{{Name: "hourly", Schedule: mustSchedule(t, "0 0 * * * *"),
			Handler: func(ctx context.Context, run job.Run) error {
				mu.Lock()
				ran[run.ID]++
				mu.Unlock()
				return nil
			}}}
		from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(from.Add(200 * time.Hour)))
		to := from.Add(99 * time.Hour)
		pre := memory.New(store, "earlier")
		ctx := context.Background()
		want := map[string]bool{}
		for i := range 100 {
			run := claim.Run{Job: "hourly", At: from.Add(time.Duration(i) * time.Hour)}
			if i%2 == 1 {
				want[run.ID()] = true
				continue
			}
			cl, err := claim.ClaimOne(ctx, pre, run, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			st := claim.Succeeded
			switch i {
			case 10, 20:
				st = claim.Failed
			case 30:
				st = claim.Missed
				// Never started: a backfill runs it, under a rerun's id.
				want[claim.Run{Job: run.Job, At: run.At.Add(1)}.ID()] = true
			}
			if err := claim.ReleaseOne(ctx, pre, cl, st); err != nil {
				t.Fatal(err)
			}
		}
		newRunner := func(name string) *runner.Runner {
			r, err := runner.New(runner.Options{Claimer: memory.New(store, name), Instance: name, Lease: 3 * time.Second}, jobs)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		// A dry run plans without running.
		plan, sum, err := newRunner("dry").Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, DryRun: true})
		if err != nil || sum.Instants != 100 || sum.Planned != 51 || len(ran) != 0 || len(plan) != 100 {
			t.Fatalf("dry run: %+v %v, ran %d", sum, err, len(ran))
		}
		var wg sync.WaitGroup
		for _, name := range []string{"b1", "b2", "b3"} {
			wg.Go(func() {
				items, s, err := newRunner(name).Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, MaxConcurrent: 4})
				if err != nil || s.Errors != 0 || s.Failed != 0 {
					t.Errorf("%s: %+v %v", name, s, err)
					for _, it := range items {
						if it.Status != "succeeded" && it.Action != runner.ActionKeep {
							t.Logf("%+v", it)
						}
					}
				}
			})
		}
		wg.Wait()
		mu.Lock()
		if len(ran) != 51 {
			t.Errorf("ran %d distinct runs, want 51", len(ran))
		}
		for id, n := range ran {
			if !want[id] && n > 0 {
				t.Errorf("%s ran though it had run before the backfill", id)
			}
			if n != 1 {
				t.Errorf("%s ran %d times", id, n)
			}
		}
		clear(ran)
		mu.Unlock()

		items, sum, err := newRunner("again").Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, Rerun: runner.RerunFailed})
		if err != nil || sum.Planned != 2 || sum.Succeeded != 2 {
			t.Fatalf("rerun failed: %+v %v", sum, err)
		}
		for _, it := range items {
			if it.Action == runner.ActionRerun {
				r, _ := claim.ParseID(it.RunID)
				if it.Was != string(claim.Failed) || r.At.Sub(it.At) != 1 || ran[it.RunID] != 1 {
					t.Errorf("rerun %+v: want the failed instant + 1ns, run once", it)
				}
			}
		}
		if _, sum, _ := newRunner("third").Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, Rerun: runner.RerunFailed}); sum.Planned != 0 {
			t.Fatalf("a second rerun of failed runs plans %d, want 0: the reruns succeeded", sum.Planned)
		}
		if _, _, err := newRunner("x").Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: time.Now().Add(time.Hour)}); err == nil {
			t.Fatal("a backfill into the future was accepted")
		}
	})
}
