package main_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReplicasLeaveASQLiteFileDeletedUnderThem: replicas coordinate through
// the database at the configured path: the file, its -wal and its -shm.
// Deleted under two running replicas, with a third started on what the
// path names then, the two would have gone on with their own ledger (in
// the deleted files) beside the third's, and every run would have
// executed twice (the -wal and -shm alone: found by an outside review).
// They stop claiming instead and exit 1, saying why, so that their
// supervisor starts them again on what the path names now; the third runs
// the schedule meanwhile.
func TestReplicasLeaveASQLiteFileDeletedUnderThem(t *testing.T) {
	for _, tc := range []struct {
		name     string
		suffixes []string
	}{
		{"file", []string{"", "-wal", "-shm"}},
		{"wal and shm", []string{"-wal", "-shm"}},
	} {
		t.Run(tc.name, func(t *testing.T) { replicasLeaveDeletedFiles(t, tc.suffixes) })
	}
}

func replicasLeaveDeletedFiles(t *testing.T, suffixes []string) {
	dir := t.TempDir()
	db := filepath.Join(dir, "fleet.db")
	config := writeConfig(t, dir, `instance_id: ${REPLICA}
claimer:
  kind: sqlite
  lease: 2s
  renew_every: 500ms
  max_clock_skew: 200ms
  sqlite:
    path: `+db+`
http:
  addr: ""
log:
  format: json
shutdown_grace: 200ms
jobs:
  example.sleep:
    schedule: "* * * * * *"
    params:
      duration: 10ms
`)
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"old-1", "old-2", "new-1"} {
				// The tail: what a replica said last is why it stopped
				// (a CI log keeps only so much of a failure's output).
				data, _ := os.ReadFile(filepath.Join(dir, name+".log"))
				lines := strings.SplitAfter(string(data), "\n")
				t.Logf("%s's log, its last lines:\n%s", name, strings.Join(lines[max(len(lines)-12, 0):], ""))
			}
		}
	})
	succeeded := func(name string) int {
		n := 0
		for _, e := range readEvents(t, dir, name) {
			if e.Msg == "run finished" && e.Status == "succeeded" {
				n++
			}
		}
		return n
	}
	started := func(name string) bool {
		for _, e := range readEvents(t, dir, name) {
			if e.Msg == "scheduler started" {
				return true
			}
		}
		return false
	}
	old := []*proc{startReplica(t, dir, config, "old-1"), startReplica(t, dir, config, "old-2")}
	waitFor(t, "the first replicas to run the schedule", func() bool {
		return started("old-1") && started("old-2") && succeeded("old-1")+succeeded("old-2") >= 2
	})

	for _, suffix := range suffixes {
		if err := os.Remove(db + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	deleted := time.Now()
	startReplica(t, dir, config, "new-1")
	// Each old replica notices at its next write (a claim, a renewal),
	// and stops.
	for _, p := range old {
		select {
		case <-p.done:
			if code := p.cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("%s exited %d, want 1", p.name, code)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not stop within 30s of the deletion", p.name)
		}
	}
	seen := map[string]time.Time{}
	for _, p := range old {
		for _, e := range readEvents(t, dir, p.name) {
			if strings.Contains(e.Error, db) && strings.Contains(e.Error, "since this process opened it") {
				if _, ok := seen[p.name]; !ok {
					seen[p.name] = e.Time
				}
			}
		}
		if _, ok := seen[p.name]; !ok {
			t.Errorf("%s's log does not say its database was deleted", p.name)
		}
	}
	before := succeeded("new-1")
	waitFor(t, "the new replica to run the schedule", func() bool { return succeeded("new-1") >= before+3 })

	for _, p := range old {
		at := seen[p.name]
		for _, e := range readEvents(t, dir, p.name) {
			// A run started before the deletion may still be finishing;
			// none may start after the replica saw the file gone.
			if e.Msg == "run started" && e.Time.After(at) {
				t.Errorf("%s started %s at %s, after it saw its database gone at %s (deleted at %s)",
					p.name, e.RunID, e.Time.Format(time.StampMilli), at.Format(time.StampMilli), deleted.Format(time.StampMilli))
			}
		}
	}
}
