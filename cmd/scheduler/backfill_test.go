package main_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// sqliteConfig writes dir/name.yaml: the replicas' settings on the SQLite
// file db, lease 2s, instance REPLICA (default operator), and jobs (the
// YAML under jobs:).
func sqliteConfig(t *testing.T, dir, db, name, jobs string) string {
	t.Helper()
	p := filepath.Join(dir, name+".yaml")
	body := `instance_id: ${REPLICA:-operator}
claimer:
  kind: sqlite
  sqlite:
    path: ` + db + `
  lease: 2s
` + replicaSettings + "jobs:\n" + jobs
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startOperator starts an operator's command (backfill, trigger --here)
// in dir, its log in dir/name.log, and returns it, its stdout and a
// channel closed once it exited. It is killed at the test's end.
func startOperator(t *testing.T, dir, name string, args ...string) (*exec.Cmd, *bytes.Buffer, <-chan struct{}) {
	t.Helper()
	lf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	out := &bytes.Buffer{}
	cmd := exec.Command(binary, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, out, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited; _ = lf.Close() })
	return cmd, out, exited
}

// A backfill process killed (SIGKILL) or stopped (SIGTERM) while its runs
// worked leaves past instants live that no replica's schedule watches.
// Running the same backfill again finishes them: each is taken over (once
// its dead holder's lease lapsed, or at once when it was handed back) and
// runs to success as attempt 2, and nothing else runs.
func TestABackfillRunAgainFinishesWhatAKilledOneLeft(t *testing.T) {
	testenv.WallClock(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(testenv.FastDir(t), "shared.db")
			// The first backfill's sleeps last an hour: it is stopped
			// mid-run. The second runs with sleeps of 100ms.
			conf := func(name, duration string) string {
				return sqliteConfig(t, dir, db, name, `  example.sleep:
    schedule: "0 * * * * *"
    params:
      duration: `+duration+"\n")
			}
			to := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
			from := to.Add(-2 * time.Minute)
			args := func(config string) []string {
				return []string{"backfill", "example.sleep", "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339),
					"--max-concurrent", "3", "--json", "--config", config}
			}
			first, firstOut, exited := startOperator(t, dir, "first", args(conf("slow", "1h"))...)
			started := map[string]bool{}
			waitFor(t, "the first backfill to start its 3 runs", func() bool {
				for _, e := range readEvents(t, dir, "first") {
					if e.Msg == "run started" {
						started[e.RunID] = true
					}
				}
				return len(started) == 3
			})
			_ = first.Process.Signal(sig)
			<-exited
			var out struct {
				Items   []runner.BackfillItem  `json:"items"`
				Summary runner.BackfillSummary `json:"summary"`
			}
			if sig == syscall.SIGTERM {
				// Stopped, it says what it left: handed back, not failed.
				if err := json.Unmarshal(firstOut.Bytes(), &out); err != nil || out.Summary.Interrupted != 3 || out.Summary.Failed != 0 {
					t.Fatalf("the stopped backfill reported %+v (%v), want its 3 runs interrupted, none failed\n%s", out.Summary, err, firstOut.String())
				}
				if stderr := readLog(t, dir, "first"); first.ProcessState.ExitCode() != 1 ||
					!strings.Contains(stderr, "backfill example.sleep: stopped") || strings.Contains(stderr, "context canceled") {
					t.Errorf("the stopped backfill exited %d, its stderr ending\n%s\nwant 1 and that it stopped, not a bare \"context canceled\"",
						first.ProcessState.ExitCode(), stderr[max(0, len(stderr)-400):])
				}
			}

			r := run(t, dir, args(conf("fast", "100ms"))...)
			out.Items, out.Summary = nil, runner.BackfillSummary{}
			if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != 0 {
				t.Fatalf("second backfill: exit %d, %v\n%s\n%s", r.code, err, r.stdout, r.stderr)
			}
			if s := out.Summary; s.Instants != 3 || s.Planned != 3 || s.Succeeded != 3 || s.Kept != 0 {
				t.Fatalf("second backfill: %+v, want the 3 instants the first left resumed and succeeded", s)
			}
			for _, it := range out.Items {
				if it.Action != runner.ActionResume || !started[it.RunID] || it.Status != string(claim.Succeeded) {
					t.Errorf("%+v: want a run the first backfill started, resumed and succeeded", it)
				}
			}
			for _, rec := range history(t, dir, conf("fast", "100ms")) {
				if rec.Status != claim.Succeeded || rec.Attempt != 2 || !started[rec.RunID] {
					t.Errorf("%s: %s attempt %d, want each of the 3 instants succeeded as attempt 2", rec.RunID, rec.Status, rec.Attempt)
				}
			}
		})
	}
}
