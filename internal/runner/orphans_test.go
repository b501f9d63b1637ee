package runner_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// A replica started after a job was removed from its configuration says,
// once, that the job's live runs whose holders died are left to a
// replica that runs the job: it takes none over itself. A run still
// renewed (a job new on other replicas, in a rolling deploy) is not
// named. Without it, such a run showed running for good, with no word
// from any replica (an outside review).
func TestStartUpNamesTheOrphansOfJobsItDoesNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		ctx := context.Background()
		at := time.Now().UTC().Truncate(time.Second)
		dead := memory.New(store, "dead")
		for _, run := range []claim.Run{{Job: "gone", At: at.Add(-2 * time.Second)}, {Job: "gone", At: at.Add(-time.Second)}} {
			if _, err := claim.ClaimOne(ctx, dead, run, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := claim.ClaimOne(ctx, memory.New(store, "alive"), claim.Run{Job: "new", At: at}, time.Hour); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second) // the dead holder's leases lapse
		var logs strings.Builder
		var ran atomic.Int32
		r, err := runner.New(runner.Options{Claimer: memory.New(store, "a"), ClaimerName: "memory", Instance: "a", Lease: 3 * time.Second,
			Logger: slog.New(slog.NewJSONHandler(&logs, nil))},
			[]runner.Job{{Name: "kept", Schedule: mustSchedule(t, "@every 1s"), Handler: func(context.Context, job.Run) error { ran.Add(1); return nil }}})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(rctx) }()
		time.Sleep(3 * time.Second)
		cancel()
		<-done
		var named []map[string]any
		for line := range strings.Lines(logs.String()) {
			var e map[string]any
			if json.Unmarshal([]byte(line), &e) == nil && strings.HasPrefix(e["msg"].(string), "live runs of a job this replica does not run") {
				named = append(named, e)
			}
		}
		if len(named) != 1 || named[0]["job"] != "gone" || named[0]["count"] != float64(2) ||
			named[0]["run_id"] != (claim.Run{Job: "gone", At: at.Add(-2 * time.Second)}).ID() || named[0]["holder"] != "dead" {
			t.Fatalf("start-up named %v, want job gone once, with its 2 orphans, the oldest and its holder", named)
		}
		recs, err := memory.New(store, "x").History(ctx, "gone", 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if rec.Status != claim.Running || rec.Holder != "dead" {
				t.Errorf("%s: %s by %s, want left running by its dead holder", rec.RunID, rec.Status, rec.Holder)
			}
		}
		if ran.Load() == 0 {
			t.Error("the replica's own job never ran")
		}
	})
}
