package main_test

import (
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// history reads the recorded runs of example.sleep through the CLI.
func history(t *testing.T, dir, config string) []claim.Record {
	t.Helper()
	r := run(t, dir, "runs", "--config", config, "--job", "example.sleep", "--limit", "2000", "--json")
	if r.code != 0 {
		t.Fatalf("runs: %+v", r)
	}
	var recs []claim.Record
	if err := json.Unmarshal([]byte(r.stdout), &recs); err != nil {
		t.Fatalf("runs --json: %v\n%s", err, r.stdout)
	}
	return recs
}

// startedCount counts "run started" events per run id across the logs.
func startedCount(t *testing.T, dir string, names []string) map[string]int {
	n := map[string]int{}
	for _, e := range readEvents(t, dir, names...) {
		if e.Msg == "run started" {
			n[e.RunID]++
		}
	}
	return n
}

// TestOperatorControlsAcrossReplicaProcesses drives the operator's
// controls through the CLI against three replica processes on every
// claimer:
//   - a pause reaches every replica within one control tick, and each
//     paused instant is recorded skipped once, by one replica;
//   - a trigger sent twice under one request id runs once fleet-wide,
//     and --wait follows it to its end;
//   - a backfill of 100 instants, half of them run by an earlier
//     backfill, runs exactly the other half;
//   - killing every replica across instants records each of them missed
//     exactly once when the replicas come back together.
func TestOperatorControlsAcrossReplicaProcesses(t *testing.T) {
	testenv.WallClock(t)
	blocks := map[string]func(t *testing.T, dir string) string{
		"sqlite": func(t *testing.T, dir string) string {
			return "  kind: sqlite\n  sqlite:\n    path: " + filepath.Join(testenv.FastDir(t), "shared.db") + "\n"
		},
		"postgres": func(t *testing.T, dir string) string {
			return "  kind: postgres\n  postgres:\n    dsn: \"" + pgSchema(t) + "\"\n"
		},
		"redis": func(t *testing.T, dir string) string {
			return "  kind: redis\n  redis:\n    addr: " + testenv.RedisAddr(t) + "\n    prefix: \"ctl:" + randHex() + ":\"\n"
		},
		"redlock": func(t *testing.T, dir string) string {
			return "  kind: redlock\n  redlock:\n    addrs: [" + strings.Join(testenv.RedlockAddrs(t, 5), ", ") +
				"]\n    prefix: \"ctl:" + randHex() + ":\"\n"
		},
	}
	allAtOnce(t, slices.Sorted(maps.Keys(blocks)), func(t *testing.T, kind string) {
		block := blocks[kind]
		// Two fleets side by side, each on a namespace and a directory
		// of its own: one for the pause, the triggers and the
		// backfills, one for the outage. Their replicas wait on the
		// clock far more than they compute; one after another, the two
		// parts took about a minute.
		start := func(t *testing.T) *ctlFleet {
			f := &ctlFleet{dir: t.TempDir(), names: []string{"r1", "r2", "r3"}, procs: map[string]*proc{}}
			dir, names, procs := f.dir, f.names, f.procs
			f.config = writeConfig(t, dir, `instance_id: ${REPLICA:-operator}
claimer:
`+block(t, dir)+`  lease: 3s
`+replicaSettings+`jobs:
  example.sleep:
    schedule: "*/2 * * * * *"
    params:
      duration: 100ms
`)
			for _, n := range names {
				procs[n] = startReplica(t, dir, f.config, n)
			}
			f.all = append([]string(nil), names...)
			t.Cleanup(func() {
				if t.Failed() {
					dumpRuns(t, dir, f.all)
				}
			})
			waitFor(t, "a scheduled run to succeed", func() bool {
				for _, e := range readEvents(t, dir, names...) {
					if e.Msg == "run finished" && e.Status == "succeeded" {
						return true
					}
				}
				return false
			})
			return f
		}
		// The two fleets at once: t.Parallel would run them two at a time
		// across every kind (allAtOnce).
		halves := map[string]func(t *testing.T){
			"Controls": func(t *testing.T) {
				t0 := time.Now().UTC().Truncate(2 * time.Second)
				f := start(t)
				dir, config, names := f.dir, f.config, f.names
				// Pause: every replica hears of it within a tick.
				if r := run(t, dir, "pause", "example.sleep", "--note", "drill", "--by", "test", "--config", config); r.code != 0 {
					t.Fatalf("pause: %+v", r)
				}
				paused := time.Now()
				for _, n := range names {
					waitFor(t, n+" to log the pause", func() bool {
						for _, e := range readEvents(t, dir, n) {
							if e.Msg == "job paused" {
								if late := e.Time.Sub(paused); late > 3*time.Second {
									t.Errorf("%s heard of the pause %v after it, want within a tick", n, late)
								}
								return true
							}
						}
						return false
					})
				}
				if r := run(t, dir, "jobs", "--config", config); r.code != 0 || !strings.Contains(r.stdout, "yes, by test") || !strings.Contains(r.stdout, "drill") {
					t.Fatalf("jobs does not show the pause: %+v", r)
				}
				time.Sleep(7 * time.Second) // three or four instants fall due while paused
				if r := run(t, dir, "resume", "example.sleep", "--config", config); r.code != 0 {
					t.Fatalf("resume: %+v", r)
				}
				resumed := time.Now()
				// Instants from a tick after the pause to the resume: skipped,
				// each once, by one replica.
				inPause := 0
				for _, rec := range history(t, dir, config) {
					if rec.At.After(paused.Add(2*time.Second)) && rec.At.Before(resumed) {
						inPause++
						if rec.Status != claim.Skipped {
							t.Errorf("%s: %s while paused, want skipped", rec.RunID, rec.Status)
						}
					}
				}
				if inPause < 2 {
					t.Fatalf("%d instants recorded while paused, want 3 or so", inPause)
				}
				t.Logf("%s: %d instants skipped while paused", kind, inPause)
				skips := map[string]int{}
				for _, e := range readEvents(t, dir, names...) {
					if e.Msg == "run skipped" && e.Reason == runner.ReasonPaused {
						skips[e.RunID]++
					}
				}
				for id, n := range skips {
					if n != 1 {
						t.Errorf("%s: logged skipped as paused %d times, want once fleet-wide", id, n)
					}
				}
				if started := startedCount(t, dir, names); len(started) == 0 {
					t.Fatal("nothing ran")
				}

				// Trigger twice under one request id: one run, fleet-wide.
				first := run(t, dir, "trigger", "example.sleep", "--request-id", "drill-1", "--note", "by hand", "--wait", "--timeout", "60s", "--config", config)
				if first.code != 0 || !strings.Contains(first.stdout, ": succeeded") {
					t.Fatalf("trigger --wait: %+v", first)
				}
				again := run(t, dir, "trigger", "--config", config, "--request-id", "drill-1", "example.sleep")
				if again.code != 0 || !strings.Contains(again.stdout, "already made") {
					t.Fatalf("second trigger: %+v", again)
				}
				time.Sleep(2 * time.Second) // a second run, if any, would start within a tick
				manual := 0
				for id, n := range startedCount(t, dir, names) {
					r, _ := claim.ParseID(id)
					if r.At.Nanosecond() != 0 {
						manual++
						if n != 1 {
							t.Errorf("manual run %s started %d times", id, n)
						}
					}
				}
				if manual != 1 {
					t.Fatalf("%d manual runs started after one request sent twice, want 1", manual)
				}
				said := 0
				for _, e := range readEvents(t, dir, names...) {
					if e.Msg == "run requested" && e.RequestID == "drill-1" {
						said++
					}
				}
				if said != 1 {
					t.Fatalf("the request was logged %d times with who and why, want once, by the replica that ran it", said)
				}

				// Backfill 100 past instants, of which an earlier backfill ran
				// the first 50.
				from := t0.Add(-400 * time.Second)
				mid, to := from.Add(98*time.Second), from.Add(198*time.Second)
				bf := func(to time.Time) (runner.BackfillSummary, []runner.BackfillItem) {
					r := run(t, dir, "backfill", "example.sleep", "--from", from.Format(time.RFC3339), "--to", to.Format(time.RFC3339),
						"--max-concurrent", "8", "--json", "--config", config)
					if r.code != 0 {
						t.Fatalf("backfill to %s: %+v", to, r)
					}
					var out struct {
						Items   []runner.BackfillItem  `json:"items"`
						Summary runner.BackfillSummary `json:"summary"`
					}
					if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
						t.Fatalf("backfill --json: %v\n%s", err, r.stdout)
					}
					return out.Summary, out.Items
				}
				if s, _ := bf(mid); s.Instants != 50 || s.Succeeded != 50 {
					t.Fatalf("first backfill: %+v, want 50 instants run", s)
				}
				s, items := bf(to)
				if s.Instants != 100 || s.Planned != 50 || s.Succeeded != 50 || s.Kept != 50 {
					t.Fatalf("second backfill: %+v, want the other 50 run", s)
				}
				for _, it := range items {
					if (it.Action == runner.ActionRun) != it.At.After(mid) {
						t.Errorf("%s: %s", it.RunID, it.Action)
					}
				}
			},
			"Outage": func(t *testing.T) {
				f := start(t)
				dir, config, names, procs := f.dir, f.config, f.names, f.procs
				// Kill every replica, let instants pass, bring three back.
				// An instant that fell due while the kills went out, or just
				// before (its claim held back by the spread), may be missed
				// too: the count below starts a period before the first kill.
				killing := time.Now()
				for _, n := range names {
					_ = procs[n].cmd.Process.Signal(syscall.SIGKILL)
					<-procs[n].done
				}
				down := time.Now()
				time.Sleep(12 * time.Second) // past the late tolerance (2×500ms + 5s) of several instants
				back := []string{"r4", "r5", "r6"}
				up := time.Now()
				// Instants more than the late tolerance before the replicas came
				// back are missed; later ones still run on time.
				missedBy := up.Add(-6 * time.Second)
				f.all = append(f.all, back...)
				for _, n := range back {
					startReplica(t, dir, config, n)
				}
				// Recording waits for the replicas to start and to read the
				// history: give a loaded machine a minute.
				for deadline := time.Now().Add(time.Minute); ; {
					missed, ok := 0, true
					recs := history(t, dir, config)
					for _, rec := range recs {
						if rec.At.After(down) && rec.At.Before(missedBy) {
							ok = ok && rec.Status == claim.Missed
							missed++
						}
					}
					if ok && missed >= 2 {
						break
					}
					if time.Now().After(deadline) {
						for _, rec := range recs {
							if rec.At.After(down.Add(-5 * time.Second)) {
								t.Logf("%s %s %s attempt %d", rec.RunID, rec.Status, rec.Holder, rec.Attempt)
							}
						}
						t.Fatalf("the instants from %s to %s were not all recorded missed", down.Format("15:04:05.000"), missedBy.Format("15:04:05.000"))
					}
					time.Sleep(100 * time.Millisecond) // polling the backend through the CLI
				}
				time.Sleep(2 * time.Second) // a second recording, if any, would land by now
				logged := 0
				for _, e := range readEvents(t, dir, back...) {
					switch {
					case e.Reason != runner.ReasonMisfire:
					case e.Msg == "run skipped":
						logged++
					case e.Msg == "runs skipped":
						logged += e.Count
					}
				}
				var ids []string
				for _, rec := range history(t, dir, config) {
					if rec.Status == claim.Missed && rec.At.After(killing.Add(-2*time.Second)) {
						ids = append(ids, rec.RunID)
					}
				}
				if logged != len(ids) {
					t.Fatalf("%d missed runs logged by the replicas that came back, %d recorded (%v): want each once", logged, len(ids), ids)
				}
				t.Logf("%s: %d missed in the outage", kind, len(ids))
			},
		}
		allAtOnce(t, slices.Sorted(maps.Keys(halves)), func(t *testing.T, name string) { halves[name](t) })
	})
}

// ctlFleet is one of TestOperatorControlsAcrossReplicaProcesses' fleets:
// its directory and config, its replicas (names, started as procs), and
// every replica it has had (all), whose runs a failure dumps.
type ctlFleet struct {
	dir, config string
	names       []string
	procs       map[string]*proc
	all         []string
}
