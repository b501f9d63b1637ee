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
// the file at the configured path. Deleted under two running replicas, with
// a third started on the new file at the path, the two would have gone on
// with their own ledger (in the deleted file) beside the third's, and every
// run would have executed twice. They stop claiming instead, saying why,
// and the third runs the schedule alone.
func TestReplicasLeaveASQLiteFileDeletedUnderThem(t *testing.T) {
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
	succeeded := func(name string) int {
		n := 0
		for _, e := range readEvents(t, dir, name) {
			if e.Msg == "run finished" && e.Status == "succeeded" {
				n++
			}
		}
		return n
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"old-1", "old-2", "new-1"} {
				data, _ := os.ReadFile(filepath.Join(dir, name+".log"))
				t.Logf("%s's log:\n%s", name, data)
			}
		}
	})
	startReplica(t, dir, config, "old-1")
	startReplica(t, dir, config, "old-2")
	started := func(name string) bool {
		for _, e := range readEvents(t, dir, name) {
			if e.Msg == "scheduler started" {
				return true
			}
		}
		return false
	}
	waitFor(t, "the first replicas to run the schedule", func() bool {
		return started("old-1") && started("old-2") && succeeded("old-1")+succeeded("old-2") >= 2
	})

	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(db + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	deleted := time.Now()
	startReplica(t, dir, config, "new-1")
	// Each old replica notices at its next write: a claim, a renewal.
	refused := func(name string) (time.Time, bool) {
		for _, e := range readEvents(t, dir, name) {
			if e.Msg == "claim failed; retrying" && strings.Contains(e.Error, db) && strings.Contains(e.Error, "since this process opened it") {
				return e.Time, true
			}
		}
		return time.Time{}, false
	}
	waitFor(t, "the old replicas to refuse to claim on the file they opened", func() bool {
		_, a := refused("old-1")
		_, b := refused("old-2")
		return a && b
	})
	before := succeeded("new-1")
	waitFor(t, "the new replica to run the schedule", func() bool { return succeeded("new-1") >= before+3 })

	for _, name := range []string{"old-1", "old-2"} {
		at, _ := refused(name)
		for _, e := range readEvents(t, dir, name) {
			// A run started before the deletion may still be finishing;
			// none may start after the replica saw the file gone.
			if e.Msg == "run started" && e.Time.After(at) {
				t.Errorf("%s started %s at %s, after it saw the file gone at %s (deleted at %s)",
					name, e.RunID, e.Time.Format(time.StampMilli), at.Format(time.StampMilli), deleted.Format(time.StampMilli))
			}
		}
	}
}
