package main_test

import (
	"cmp"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/web"
)

// TestRunSemanticsAcrossReplicaProcesses checks the run semantics a job
// configures against three replica processes on every claimer, from their
// JSON logs and `scheduler runs --json`:
//   - retries: a run whose first two attempts fail starts three times,
//     attempts 1, 2 and 3 with growing fences, succeeds once, and shows
//     its two failed attempts;
//   - overlap buffer-one: no run starts while another still runs, and
//     instants that find one already waiting are skipped, once;
//   - overlap replace: each replaced run ends skipped, once, on the
//     replica that held it, before the run that replaced it starts;
//   - misfire run-all: after every replica was killed across at least
//     five instants, the newest three run once each, oldest first, one
//     after another, and the older ones are recorded missed once.
//
// A job's handler is the one registered under its name, and the shipped
// binary's only job that runs without a database is example.sleep, so
// each semantic is a phase of its own: example.sleep configured for it, a
// fleet of its own, on a claimer namespace of its own (file, schema or
// key prefix). The run-all phase's outage lasts while the other phases
// run.
func TestRunSemanticsAcrossReplicaProcesses(t *testing.T) {
	testenv.WallClock(t)
	// Each returns a func that gives a fresh, isolated claimer block.
	claimers := map[string]func(t *testing.T) func() string{
		"sqlite": func(t *testing.T) func() string {
			// tmpfs, as in the other process tests: fsync stalls of a
			// shared disk are not what this test is about.
			fast := testenv.FastDir(t)
			return func() string {
				return "  kind: sqlite\n  sqlite:\n    path: " + filepath.Join(fast, randHex()+".db") + "\n"
			}
		},
		"postgres": func(t *testing.T) func() string {
			return func() string { return "  kind: postgres\n  postgres:\n    dsn: \"" + pgSchema(t) + "\"\n" }
		},
		"redis": func(t *testing.T) func() string {
			addr := testenv.RedisAddr(t)
			return func() string {
				return "  kind: redis\n  redis:\n    addr: " + addr + "\n    prefix: \"" + testenv.RedisPrefix(t, addr) + "\"\n"
			}
		},
		"redlock": func(t *testing.T) func() string {
			addrs := testenv.RedlockAddrs(t, 5)
			return func() string {
				return "  kind: redlock\n  redlock:\n    addrs: [" + strings.Join(addrs, ", ") +
					"]\n    prefix: \"" + testenv.RedisPrefix(t, addrs...) + "\"\n"
			}
		},
	}
	// Every kind's phases at once (allAtOnce), each in a namespace and a
	// directory of its own: one after another they took 30-36s a kind.
	phases := map[string]func(t *testing.T, dir string, block func() string){
		"Retry": func(t *testing.T, dir string, block func() string) {
			checkRetries(t, phaseDir(t, dir, "retry"), block())
		},
		"BufferOne": func(t *testing.T, dir string, block func() string) {
			checkBufferOne(t, phaseDir(t, dir, "bufferone"), block())
		},
		"Replace": func(t *testing.T, dir string, block func() string) {
			checkReplace(t, phaseDir(t, dir, "replace"), block())
		},
		"MisfireRunAll": func(t *testing.T, dir string, block func() string) {
			checkCatchUp(t, startOutage(t, phaseDir(t, dir, "runall"), block()))
		},
	}
	allAtOnce(t, slices.Sorted(maps.Keys(claimers)), func(t *testing.T, kind string) {
		block, dir := claimers[kind](t), t.TempDir()
		allAtOnce(t, slices.Sorted(maps.Keys(phases)), func(t *testing.T, phase string) { phases[phase](t, dir, block) })
	})
}

// fleet is the three replicas a phase starts.
var fleet = []string{"r1", "r2", "r3"}

func phaseDir(t *testing.T, dir, name string) string {
	t.Helper()
	d := filepath.Join(dir, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// phaseConfig writes the config of a phase's replicas: the claimer block,
// a lease of 3s and replicaSettings, and example.sleep with jobBody.
func phaseConfig(t *testing.T, dir, block, jobBody string) string {
	t.Helper()
	return writeConfig(t, dir, "instance_id: ${REPLICA:-operator}\nclaimer:\n"+block+"  lease: 3s\n"+replicaSettings+
		"jobs:\n  example.sleep:\n"+jobBody)
}

func startFleet(t *testing.T, dir, config string, names ...string) []*proc {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			dumpRuns(t, dir, names)
		}
	})
	var ps []*proc
	for _, n := range names {
		ps = append(ps, startReplica(t, dir, config, n))
	}
	return ps
}

// stopFleet signals every replica and waits for each to exit, so that
// the logs read next are complete.
func stopFleet(t *testing.T, ps []*proc, sig syscall.Signal) {
	t.Helper()
	for _, p := range ps {
		_ = p.cmd.Process.Signal(sig)
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not exit after %v", p.name, sig)
		}
	}
}

// fleetUp waits until every named replica logged "scheduler started"
// and returns when each did, by name. A replica dispatches the instants
// from there on (and catches up the one before, under run-all): under a
// loaded machine that came seconds after its process started.
func fleetUp(t *testing.T, dir string, names ...string) map[string]time.Time {
	t.Helper()
	up := map[string]time.Time{}
	waitFor(t, "every replica to start", func() bool {
		for _, n := range names {
			if _, ok := up[n]; ok {
				continue
			}
			for _, e := range readEvents(t, dir, n) {
				if e.Msg == "scheduler started" {
					up[n] = e.Time
					break
				}
			}
		}
		return len(up) == len(names)
	})
	return up
}

func sleepRunID(at time.Time) string { return "example.sleep@" + at.UTC().Format(time.RFC3339Nano) }

// byRun groups the events with message msg by run id, in log order per
// replica.
func byRun(events []event, msg string) map[string][]event {
	m := map[string][]event{}
	for _, e := range events {
		if e.Msg == msg && e.RunID != "" {
			m[e.RunID] = append(m[e.RunID], e)
		}
	}
	return m
}

func succeededIn(es []event) int {
	n := 0
	for _, e := range es {
		if e.Status == string(claim.Succeeded) {
			n++
		}
	}
	return n
}

// sleepRuns reads example.sleep's runs as `scheduler runs --json` shows
// them (web.Run: the record, its failed attempts, the retry pending), by
// run id.
func sleepRuns(t *testing.T, dir, config string) map[string]web.Run {
	t.Helper()
	r := run(t, dir, "runs", "--config", config, "--job", "example.sleep", "--limit", "1000", "--json")
	if r.code != 0 {
		t.Fatalf("runs: %+v", r)
	}
	var runs []web.Run
	if err := json.Unmarshal([]byte(r.stdout), &runs); err != nil {
		t.Fatalf("runs --json: %v\n%s", err, r.stdout)
	}
	m := map[string]web.Run{}
	for _, x := range runs {
		m[x.RunID] = x
	}
	return m
}

// checkRetries: every instant fails twice (fail_attempts: 2) and is
// retried in the same run, by whichever replica claims it next.
func checkRetries(t *testing.T, dir, block string) {
	config := phaseConfig(t, dir, block, `    schedule: "* * * * * *"
    overlap: allow
    retry:
      max_attempts: 3
      backoff: 300ms
      max_backoff: 5s
    params:
      duration: 100ms
      fail_attempts: 2
`)
	ps := startFleet(t, dir, config, fleet...)
	// Three instants from one the replicas are all up for (an instant
	// before one was up may be missed: misfire skip); every instant
	// retries alike, so which three does not matter.
	last := slices.MaxFunc(slices.Collect(maps.Values(fleetUp(t, dir, fleet...))), time.Time.Compare)
	first := last.UTC().Truncate(time.Second).Add(2 * time.Second)
	var ids []string
	for i := range 3 {
		ids = append(ids, sleepRunID(first.Add(time.Duration(i)*time.Second)))
	}
	waitFor(t, "three instants to succeed after their retries", func() bool {
		fin := byRun(readEvents(t, dir, fleet...), "run finished")
		return !slices.ContainsFunc(ids, func(id string) bool { return succeededIn(fin[id]) == 0 })
	})
	stopFleet(t, ps, syscall.SIGTERM)

	events := readEvents(t, dir, fleet...)
	starts, retried, finished := byRun(events, "run started"), byRun(events, "run failed; retry scheduled"), byRun(events, "run finished")
	runs := sleepRuns(t, dir, config)
	moved := 0
	for _, id := range ids {
		s := slices.SortedFunc(slices.Values(starts[id]), func(a, b event) int { return cmp.Compare(a.Attempt, b.Attempt) })
		if got := attemptsOf(s); !slices.Equal(got, []int{1, 2, 3}) {
			t.Errorf("%s started as attempts %v, want [1 2 3]: %+v", id, got, s)
			continue
		}
		for i := 1; i < len(s); i++ {
			if s[i].Fence <= s[i-1].Fence {
				t.Errorf("%s: attempt %d has fence %d after %d", id, s[i].Attempt, s[i].Fence, s[i-1].Fence)
			}
			if s[i].Instance != s[i-1].Instance {
				moved++
			}
		}
		// Sorted: a replica logs its retry once its lease is cut, and the
		// next attempt may fail on another one before that line is out.
		if got := attemptsOf(retried[id]); !slices.Equal(slices.Sorted(slices.Values(got)), []int{1, 2}) {
			t.Errorf("%s: retries scheduled after attempts %v, want [1 2]", id, got)
		}
		if f := finished[id]; len(f) != 1 || f[0].Status != string(claim.Succeeded) || f[0].Attempt != 3 {
			t.Errorf("%s finished %+v, want succeeded once, at attempt 3", id, f)
		}
		r, ok := runs[id]
		if !ok {
			t.Errorf("%s: not in runs --json", id)
			continue
		}
		if r.Status != claim.Succeeded || r.Attempt != 3 || r.Fence != s[2].Fence || r.MaxAttempts != 3 || r.RetryPending != nil {
			t.Errorf("%s in runs --json: %s, attempt %d/%d, fence %d, retry pending %v; want succeeded, attempt 3/3, fence %d, none pending",
				id, r.Status, r.Attempt, r.MaxAttempts, r.Fence, r.RetryPending, s[2].Fence)
		}
		if len(r.Attempts) != 2 {
			t.Errorf("%s: runs --json shows %d failed attempts, want 2: %+v", id, len(r.Attempts), r.Attempts)
			continue
		}
		for i, a := range r.Attempts {
			if a.Attempt != i+1 || a.Status != claim.Failed || a.Fence != s[i].Fence || a.Holder != s[i].Instance ||
				a.RetryAt.IsZero() || !strings.Contains(a.Error, "fail_attempts") {
				t.Errorf("%s: failed attempt %d shown as %+v; want failed, fence %d, holder %s, a retry time and the handler's error",
					id, i+1, a, s[i].Fence, s[i].Instance)
			}
		}
	}
	t.Logf("%d of %d retries ran on another replica than the attempt before", moved, 2*len(ids))
}

func attemptsOf(es []event) []int {
	var out []int
	for _, e := range es {
		out = append(out, e.Attempt)
	}
	return out
}

// checkBufferOne: runs of 1.5s every second; each instant waits for the
// running one, and one that finds another already waiting is skipped.
func checkBufferOne(t *testing.T, dir, block string) {
	const took = 1500 * time.Millisecond
	config := phaseConfig(t, dir, block, `    schedule: "* * * * * *"
    overlap: buffer-one
    params:
      duration: 1500ms
`)
	ps := startFleet(t, dir, config, fleet...)
	overlapSkips := func(events []event) map[string][]event {
		m := map[string][]event{}
		for id, es := range byRun(events, "run skipped") {
			for _, e := range es {
				if e.Reason == runner.ReasonOverlap {
					m[id] = append(m[id], e)
				}
			}
		}
		return m
	}
	waitFor(t, "two instants skipped for overlap and three runs succeeded", func() bool {
		events := readEvents(t, dir, fleet...)
		ok := 0
		for _, f := range byRun(events, "run finished") {
			ok += succeededIn(f)
		}
		return len(overlapSkips(events)) >= 2 && ok >= 3
	})
	stopping := time.Now()
	stopFleet(t, ps, syscall.SIGTERM)

	events := readEvents(t, dir, fleet...)
	finished := byRun(events, "run finished")
	var started []event // the runs started before the fleet was stopped
	for id, s := range byRun(events, "run started") {
		if s[0].Time.After(stopping) {
			continue // a takeover of a run interrupted by the stop
		}
		if len(s) != 1 {
			t.Errorf("%s started %d times: %+v", id, len(s), s)
		}
		started = append(started, s[0])
	}
	slices.SortFunc(started, func(a, b event) int { return a.Time.Compare(b.Time) })
	// A run that succeeded slept its whole 1.5s, so its handler returned
	// no earlier than 1.5s after it started; the next run must start no
	// earlier. ("run finished" is logged after the release, which the
	// next run waits for, so its log line may come a moment after the
	// next "run started": the handler's sleep is the bound to check.)
	handedOver, finishLoggedLate := 0, 0
	for i := 1; i < len(started); i++ {
		prev, next := started[i-1], started[i]
		f := finished[prev.RunID]
		if succeededIn(f) == 0 {
			continue // cut short by the stop: its handler may have returned at any time
		}
		if next.Time.Before(prev.Time.Add(took)) {
			t.Errorf("%s started on %s at %s while %s, started on %s at %s, still slept",
				next.RunID, next.Instance, next.Time.Format("15:04:05.000"), prev.RunID, prev.Instance, prev.Time.Format("15:04:05.000"))
		}
		if next.Instance != prev.Instance {
			handedOver++
		}
		if next.Time.Before(f[0].Time) {
			finishLoggedLate++
		}
	}
	if len(started) < 3 {
		t.Fatalf("%d runs started", len(started))
	}
	skips := overlapSkips(events)
	runs := sleepRuns(t, dir, config)
	for id, s := range skips {
		if len(s) != 1 {
			t.Errorf("%s skipped for overlap %d times, want once fleet-wide: %+v", id, len(s), s)
		}
		if slices.ContainsFunc(started, func(e event) bool { return e.RunID == id }) {
			t.Errorf("%s both skipped and started", id)
		}
		if r := runs[id]; r.Status != claim.Skipped {
			t.Errorf("%s skipped for overlap, recorded %q", id, r.Status)
		}
	}
	waits := 0
	for _, e := range events {
		if e.Msg == "run waiting for the previous run" {
			waits++
		}
	}
	if waits == 0 {
		t.Error("no run waited for the previous one")
	}
	t.Logf("%d runs one after another (%d handed to another replica, %d logged their start before the previous one logged its finish), %d waited, %d skipped",
		len(started), handedOver, finishLoggedLate, waits, len(skips))
}

// checkReplace: runs of a minute every 2s, each revoked by the next
// instant wherever it runs.
func checkReplace(t *testing.T, dir, block string) {
	config := phaseConfig(t, dir, block, `    schedule: "*/2 * * * * *"
    overlap: replace
    params:
      duration: 1m
`)
	ps := startFleet(t, dir, config, fleet...)
	skippedReplaced := func(events []event) map[string][]event {
		m := map[string][]event{}
		for _, e := range events {
			if e.Msg == "run skipped" && e.Reason == runner.ReasonReplaced {
				m[e.RunID] = append(m[e.RunID], e)
			}
		}
		return m
	}
	// completed lists the replacements whose replaced run has ended and
	// whose replacing run has started, one per pair.
	completed := func(events []event) []event {
		skipped, started := skippedReplaced(events), byRun(events, "run started")
		var out []event
		for _, e := range events {
			if e.Msg == "replacing the previous run" && len(skipped[e.PreviousRunID]) > 0 && len(started[e.RunID]) > 0 &&
				!slices.ContainsFunc(out, func(o event) bool { return o.RunID == e.RunID && o.PreviousRunID == e.PreviousRunID }) {
				out = append(out, e)
			}
		}
		return out
	}
	var done []event
	waitFor(t, "three replacements to complete", func() bool {
		done = completed(readEvents(t, dir, fleet...))
		return len(done) >= 3
	})
	stopFleet(t, ps, syscall.SIGTERM)

	events := readEvents(t, dir, fleet...)
	skipped, started, finished := skippedReplaced(events), byRun(events, "run started"), byRun(events, "run finished")
	for id, s := range skipped {
		if len(s) != 1 {
			t.Errorf("%s ended as replaced %d times, want once fleet-wide: %+v", id, len(s), s)
		}
	}
	runs := sleepRuns(t, dir, config)
	across := 0
	for _, rep := range done {
		prev, skip := rep.PreviousRunID, skipped[rep.PreviousRunID][0]
		if skip.Instance != rep.PreviousHolder {
			t.Errorf("%s, held by %s, was ended by %s", prev, rep.PreviousHolder, skip.Instance)
		}
		// A replaced run that had started ends its handler, finished
		// skipped; one replaced while still waiting for its turn ends
		// without starting, so without a handler to finish.
		switch f := finished[prev]; {
		case len(started[prev]) > 0 && (len(f) != 1 || f[0].Status != string(claim.Skipped)):
			t.Errorf("%s started, then finished %+v, want skipped once", prev, f)
		case len(started[prev]) == 0 && len(f) != 0:
			t.Errorf("%s never started, but finished %+v", prev, f)
		}
		if r := runs[prev]; r.Status != claim.Skipped {
			t.Errorf("%s replaced, recorded %q", prev, r.Status)
		}
		// The replaced run is ended, its skip logged, before its release
		// lets the replacing run start.
		if s := started[rep.RunID]; len(s) != 1 || s[0].Time.Before(skip.Time) {
			t.Errorf("%s replaced %s (ended at %s) and started %+v, want once, after that", rep.RunID, prev,
				skip.Time.Format("15:04:05.000"), s)
		}
		if rep.Instance != rep.PreviousHolder {
			across++
		}
	}
	if across == 0 {
		t.Logf("every one of the %d replacements was of a run on the replacing replica itself this time", len(done))
	}
	t.Logf("%d replacements, %d of a run on another replica", len(done), across)
}

// runAllSpec is the run-all phase's schedule. A restarted replica counts
// missed instants up to its own start, so the three must all start before
// the instant after the restart: 3s apart leaves a loaded machine room.
const runAllSpec = "*/3 * * * * *"

func runAllSchedule(t *testing.T) *schedule.Schedule {
	s, err := schedule.Parse(runAllSpec, "UTC")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// outage is the run-all phase between its kill and its restart.
type outage struct {
	dir, config string
}

// startOutage starts the run-all phase's fleet, waits for a run to
// succeed, and kills every replica with SIGKILL.
func startOutage(t *testing.T, dir, block string) outage {
	config := phaseConfig(t, dir, block, `    schedule: "`+runAllSpec+`"
    misfire:
      policy: run-all
      max_catchup: 3
    params:
      duration: 300ms
`)
	ps := startFleet(t, dir, config, fleet...)
	sched := runAllSchedule(t)
	// Each replica dispatches, as it starts, the instant before its
	// start (run-all catches it up): a replica slow to start claimed that
	// one after the instant that followed it had run, and a kill in
	// between left it live. So wait past the instant after the last
	// replica's start, for one every replica was heard on.
	up := fleetUp(t, dir, fleet...)
	settled := sched.Next(slices.MaxFunc(slices.Collect(maps.Values(up)), time.Time.Compare))
	// Kill between instants, a second before the next, once the latest
	// instant's run succeeded, every replica was heard on it, and every
	// run started has finished: no run is left live for the restart to
	// take over.
	waitFor(t, "a run-all run to succeed, between instants", func() bool {
		now := time.Now()
		latest := sched.Prev(now, time.Minute)
		if sched.Next(now).Sub(now) < time.Second || !latest.After(settled) {
			return false
		}
		events := readEvents(t, dir, fleet...)
		for name := range up {
			if !slices.ContainsFunc(events, func(e event) bool { return e.Instance == name && e.RunID == sleepRunID(latest) }) {
				return false
			}
		}
		finished := byRun(events, "run finished")
		for _, msg := range []string{"run started", "run waiting for the previous run"} {
			for id := range byRun(events, msg) {
				if len(finished[id]) == 0 {
					return false
				}
			}
		}
		return succeededIn(finished[sleepRunID(latest)]) > 0
	})
	stopFleet(t, ps, syscall.SIGKILL)
	return outage{dir, config}
}

// checkCatchUp restarts the run-all phase's replicas after at least five
// instants passed with none up.
func checkCatchUp(t *testing.T, o outage) {
	const took = 300 * time.Millisecond
	sched := runAllSchedule(t)
	// The newest run recorded is where the restarted replicas count
	// missed instants from.
	var last time.Time
	for _, r := range sleepRuns(t, o.dir, o.config) {
		if r.At.After(last) {
			last = r.At
		}
		if r.Status.Live() {
			t.Fatalf("%s left %s by the kill", r.RunID, r.Status)
		}
	}
	if last.IsZero() {
		t.Fatal("no run recorded before the outage")
	}
	fifth := last
	for range 5 {
		fifth = sched.Next(fifth)
	}
	// Restart just after an instant, at least the fifth since the last
	// run, so that every replica starts before the next one.
	up := sched.Next(time.Now())
	if up.Before(fifth) {
		up = fifth
	}
	up = up.Add(100 * time.Millisecond)
	time.Sleep(time.Until(up)) // the outage is wall time
	var missed, caught []time.Time
	for at := sched.Next(last); at.Before(up); at = sched.Next(at) {
		missed = append(missed, at)
	}
	missed, caught = missed[:len(missed)-3], missed[len(missed)-3:]
	back := []string{"r4", "r5", "r6"}
	ps := startFleet(t, o.dir, o.config, back...)
	began := time.Now()

	// Each replica walks the instants it catches up in turn, running each
	// or hearing it is done, and the newest is the last of them all: once
	// every replica is past it, every claim of the catch-up was made.
	newest := sleepRunID(caught[len(caught)-1])
	waitFor(t, "every restarted replica to walk the caught-up runs", func() bool {
		past := map[string]bool{}
		for _, e := range readEvents(t, o.dir, back...) {
			if e.RunID == newest && (e.Msg == "run finished" || e.Msg == "run skipped" && e.Reason == runner.ReasonDone) {
				past[e.Instance] = true
			}
		}
		return len(past) == len(back)
	})
	stopFleet(t, ps, syscall.SIGTERM)

	events := readEvents(t, o.dir, append(slices.Clone(fleet), back...)...)
	// The first replica to start plans all three. One that starts after
	// another claimed the first of them counts from that run: it plans
	// the rest (and logs no plan for one run). A replica that plans an
	// instant after them started after the next instant.
	complete := 0
	for _, e := range events {
		if e.Msg != "catching up missed runs" {
			continue
		}
		from, _ := time.Parse(time.RFC3339Nano, e.From)
		if k := len(caught) - e.Count; k < 0 || !from.Equal(caught[k]) {
			t.Errorf("%s planned to catch up %d runs from %s, want the newest of %v; it logged that %v after the restart",
				e.Instance, e.Count, e.From, caught, e.Time.Sub(began).Round(time.Millisecond))
		}
		if e.Count == len(caught) {
			complete++
		}
	}
	if complete == 0 {
		t.Errorf("no replica planned to catch up the newest %d missed runs", len(caught))
	}
	starts, finished := byRun(events, "run started"), byRun(events, "run finished")
	runs := sleepRuns(t, o.dir, o.config)
	for i, at := range caught {
		id := sleepRunID(at)
		s := starts[id]
		if len(s) != 1 || s[0].Attempt != 1 {
			t.Errorf("caught-up run %s started %+v, want once", id, s)
			continue
		}
		if f := finished[id]; len(f) != 1 || succeededIn(f) != 1 {
			t.Errorf("caught-up run %s finished %+v, want succeeded once", id, f)
		}
		if r := runs[id]; r.Status != claim.Succeeded {
			t.Errorf("caught-up run %s recorded %q", id, r.Status)
		}
		// Oldest first, one after another: the one before slept 300ms.
		if i > 0 {
			if prev := starts[sleepRunID(caught[i-1])]; len(prev) == 1 && s[0].Time.Before(prev[0].Time.Add(took)) {
				t.Errorf("caught-up run %s started at %s, within 300ms of %s's start at %s",
					id, s[0].Time.Format("15:04:05.000"), prev[0].RunID, prev[0].Time.Format("15:04:05.000"))
			}
		}
	}
	for _, at := range missed {
		id := sleepRunID(at)
		if len(starts[id]) != 0 {
			t.Errorf("missed run %s started: %+v", id, starts[id])
		}
		if r := runs[id]; r.Status != claim.Missed {
			t.Errorf("%s recorded %q, want missed", id, r.Status)
		}
	}
	logged := 0
	for _, e := range events {
		switch {
		case e.Reason != runner.ReasonMisfire || e.Cause != runner.MissedNoReplica:
		case e.Msg == "runs skipped":
			logged += e.Count
		case e.Msg == "run skipped":
			logged++
		}
	}
	if logged != len(missed) {
		t.Errorf("%d missed runs logged, %d recorded: want each logged once", logged, len(missed))
	}
	t.Logf("outage from %s: %d instants missed, %d caught up from %s", last.Format("15:04:05"), len(missed), len(caught),
		caught[0].Format("15:04:05"))
}
