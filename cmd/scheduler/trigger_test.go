package main_test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// A `trigger --here` process killed (SIGKILL) or stopped (SIGTERM) mid-run
// leaves a run no replica dispatched: the job's only instant is on 29
// February and it allows overlap, so no overlap probe meets the run
// either. A replica process of the fleet takes it over all the same (its
// sweep): attempt 2, a higher fence, succeeded, and run nowhere else.
// Stopped, the trigger says it handed the run back.
func TestAReplicaTakesOverARunATriggerHereLeft(t *testing.T) {
	testenv.WallClock(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(testenv.FastDir(t), "shared.db")
			// The trigger's sleep lasts an hour: it is stopped mid-run.
			// The replica's lasts 100ms.
			conf := func(name, duration string) string {
				return sqliteConfig(t, dir, db, name, `  example.sleep:
    schedule: "0 0 0 29 2 *"
    overlap: allow
    params:
      duration: `+duration+"\n")
			}
			fast := conf("fast", "100ms")
			startReplica(t, dir, fast, "r1")
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(readLog(t, dir, "r1"))
				}
			})

			trig, out, exited := startOperator(t, dir, "trigger", "trigger", "--here", "example.sleep", "--config", conf("slow", "1h"))
			var left event
			waitFor(t, "the trigger to start its run", func() bool {
				for _, e := range readEvents(t, dir, "trigger") {
					if e.Msg == "run started" {
						left = e
						return true
					}
				}
				return false
			})
			_ = trig.Process.Signal(sig)
			<-exited
			if sig == syscall.SIGTERM {
				if got := trig.ProcessState.ExitCode(); got != 1 || !strings.Contains(out.String(), "example.sleep: interrupted") {
					t.Errorf("the stopped trigger exited %d saying %q, want 1 and that it handed the run back interrupted", got, out.String())
				}
			}

			var took event
			waitFor(t, "the replica to take the trigger's run over and finish it", func() bool {
				for _, e := range readEvents(t, dir, "r1") {
					if e.Msg == "run finished" && e.RunID == left.RunID {
						took = e
						return true
					}
				}
				return false
			})
			if took.Status != string(claim.Succeeded) || took.Attempt != 2 || took.Fence <= left.Fence {
				t.Errorf("the replica finished %s %s, attempt %d, fence %d; want succeeded, attempt 2, a fence above the trigger's %d",
					took.RunID, took.Status, took.Attempt, took.Fence, left.Fence)
			}
			if n := startedCount(t, dir, []string{"r1", "trigger"})[left.RunID]; n != 2 {
				t.Errorf("the run started %d times, want twice (the trigger's, then the takeover)", n)
			}
			for _, rec := range history(t, dir, fast) {
				if rec.RunID == left.RunID && (rec.Status != claim.Succeeded || rec.Attempt != 2) {
					t.Errorf("history: %s %s attempt %d, want succeeded as attempt 2", rec.RunID, rec.Status, rec.Attempt)
				}
			}
		})
	}
}
