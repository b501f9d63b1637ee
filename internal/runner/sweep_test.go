package runner_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

// A run no replica dispatched, left live by its process after the fleet
// started (a `trigger --here` killed mid-run, or stopped and its run
// handed back), is taken over by the sweep: with the job's next instant a
// year away and overlap allowed, nothing else would ever look at it. With
// the sweep off, the same run is still live a minute later, which is what
// shows the sweep did it.
func TestTheSweepTakesOverARunItsProcessLeftBehind(t *testing.T) {
	sched, err := schedule.Parse("0 0 1 7 *", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		handBack bool
		sweep    time.Duration
		want     bool
	}{
		{name: "killed", want: true},
		{name: "handed back", handBack: true, want: true},
		{name: "killed, sweep off", sweep: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				store := memory.NewStore(time.Now)
				ran := make(chan job.Run, 1)
				r, err := runner.New(runner.Options{Claimer: memory.New(store, "r1"), Instance: "r1",
					Lease: 2 * time.Second, SweepEvery: tc.sweep},
					[]runner.Job{{Name: "report", Schedule: sched, Overlap: runner.OverlapAllow,
						Handler: func(ctx context.Context, run job.Run) error { ran <- run; return nil }}})
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- r.Run(ctx) }()
				time.Sleep(5 * time.Second) // start-up recovery has read the history

				// The process that held the run: its grant, then nothing
				// (its lease lapses), or its hand-back.
				cli := memory.New(store, "cli")
				run := claim.Run{Job: "report", At: control.ManualInstant(time.Now())}
				cl, err := claim.ClaimOne(ctx, cli, run, 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if tc.handBack {
					if errs := cli.Release(ctx, []*claim.Claim{cl}, []claim.Status{claim.Interrupted}); errs[0] != nil {
						t.Fatal(errs[0])
					}
				}
				select {
				case got := <-ran:
					if !tc.want {
						t.Fatalf("run %s ran with the sweep off", got.ID)
					}
					if !got.ScheduledAt.Equal(run.At) || got.Attempt != 2 || got.Fence <= cl.Fence {
						t.Fatalf("ran %s attempt %d fence %d, want the left run %s taken over (attempt 2, fence above %d)",
							got.ID, got.Attempt, got.Fence, run.ID(), cl.Fence)
					}
				case <-time.After(time.Minute):
					if tc.want {
						recs, _ := cli.History(ctx, "report", 5)
						t.Fatalf("the left run was not taken over within a minute: history %+v", recs)
					}
				}
				synctest.Wait()
				recs, err := cli.History(ctx, "report", 5)
				if err != nil {
					t.Fatal(err)
				}
				want := claim.Running
				if tc.want {
					want = claim.Succeeded
				}
				found := false
				for _, rec := range recs {
					if rec.RunID == run.ID() {
						found = true
						if rec.Status != want {
							t.Errorf("the left run is %s, want %s", rec.Status, want)
						}
					}
				}
				if !found {
					t.Errorf("the left run is not in the history: %+v", recs)
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
