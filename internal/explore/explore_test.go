package explore

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

var (
	seeds = flag.Int("explore.seeds", 200, "how many seeds TestExplore sweeps")
	first = flag.Uint64("explore.first", 1, "the first seed TestExplore sweeps (replay one: -explore.first=N -explore.seeds=1)")
	show  = flag.Bool("explore.show", false, "log every seed's plan and verdict")
	trace = flag.String("explore.trace", "", "write every event of a seed with violations to this directory, one file per claimer and seed (a violation's report shows only the tail of each run)")
	logs  = flag.Bool("explore.logs", false, "with -explore.trace: also write the replicas' runner logs of a seed with violations, beside its events")
)

// explored runs cfg (in the caller's synctest bubble) and fails t with
// the seed and trace of each violation.
func explored(t *testing.T, cfg Config) *Result {
	t.Helper()
	runnerLog := logRunners(&cfg)
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Violations) > 0 {
		t.Errorf("seed %d: %d violations\n%s", cfg.Seed, len(res.Violations), res.Report())
		writeTrace(t, "memory", res, runnerLog)
	}
	return res
}

// logRunners gives cfg a runner log when -explore.trace and
// -explore.logs ask for one, and returns it (nil otherwise): writeTrace
// writes it beside the events of a seed with violations.
func logRunners(cfg *Config) *testenv.Logs {
	if *trace == "" || !*logs || cfg.Log != nil {
		return nil
	}
	l := &testenv.Logs{}
	cfg.Log = l
	return l
}

// sampled holds the histories of seeds 1 to sampledSeeds explored with
// the default Config, by seed: TestExplore's, read again by the tests
// that count what the sweep exercised (operator actions, run semantics,
// backfills, triggers, mixed configs). They judge the very histories
// TestExplore checked, and the package's run explores each seed once.
var sampled sync.Map

const sampledSeeds = 200

// exploredSeed explores seed with the default Config in the caller's
// synctest bubble, or returns its history if this test binary explored
// it already (sampled). A seed with violations failed the test that
// explored it.
func exploredSeed(t *testing.T, seed uint64) *Result {
	t.Helper()
	if res, ok := sampled.Load(seed); ok {
		return res.(*Result)
	}
	res := explored(t, Config{Seed: seed})
	if seed <= sampledSeeds {
		sampled.Store(seed, res)
	}
	return res
}

// writeTrace writes res's whole history to the -explore.trace directory,
// if set, and logs where.
func writeTrace(t *testing.T, kind string, res *Result, runnerLog *testenv.Logs) {
	t.Helper()
	if *trace == "" {
		return
	}
	var b strings.Builder
	b.WriteString(res.Report())
	b.WriteString("\n\nevery event:\n")
	for _, e := range res.Events {
		fmt.Fprintf(&b, "%9.3fs %s\n", e.At.Sub(res.T0).Seconds(), e)
	}
	name := filepath.Join(*trace, fmt.Sprintf("%s-%d.txt", kind, res.Seed))
	if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
		t.Errorf("trace: %v", err)
		return
	}
	t.Logf("every event: %s", name)
	if runnerLog == nil {
		return
	}
	name = filepath.Join(*trace, fmt.Sprintf("%s-%d.log", kind, res.Seed))
	if err := os.WriteFile(name, []byte(runnerLog.String()), 0o644); err != nil {
		t.Errorf("runner log: %v", err)
		return
	}
	t.Logf("runner log: %s", name)
}

// TestExplore sweeps seeds of composed faults over the runner and fails
// with each violation's seed and trace. CI pins the sweep (see .ci/run);
// replay a failure with -explore.first=SEED -explore.seeds=1.
func TestExplore(t *testing.T) {
	heavy(t)
	for seed := *first; seed < *first+uint64(*seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				if res := exploredSeed(t, seed); len(res.Violations) == 0 && *show {
					t.Log(res.Report())
				}
			})
		})
	}
}

// TestOperatorActionsAreExplored guards the operator's part of the sweep:
// across seeds its requests run (each at most once: history.Check holds
// every run id to that) and its pauses skip instants, so the controls are
// explored under the faults rather than merely configured.
func TestOperatorActionsAreExplored(t *testing.T) {
	heavy(t)
	var manual, paused, beside, seeds int
	for seed := uint64(1); seed <= 40; seed++ {
		synctest.Test(t, func(t *testing.T) {
			res := exploredSeed(t, seed)
			seeds++
			executing := map[string]map[string]string{} // job → token whose handler runs → its replica
			for _, e := range res.Events {
				switch {
				case e.Kind == history.Start:
					if control.Manual(e.Run) {
						manual++
						if res.Alongside[e.Run.ID()] && len(executing[e.Run.Job]) > 0 {
							beside++
						}
					}
					if executing[e.Run.Job] == nil {
						executing[e.Run.Job] = map[string]string{}
					}
					executing[e.Run.Job][e.Token] = e.Replica
				case e.Kind == history.Return || e.Kind == history.End:
					delete(executing[e.Run.Job], e.Token)
				case e.Kind == history.Crash:
					for _, toks := range executing {
						maps.DeleteFunc(toks, func(_, replica string) bool { return replica == e.Replica })
					}
				case e.Kind == history.Skip && e.Reason == runner.ReasonPaused:
					paused++
				}
			}
		})
	}
	// Requests sent with overlap allow (history.Spec.Alongside) run beside
	// a live run of their job now and then, not only when it is idle.
	if manual < seeds/2 || paused < seeds/2 || beside == 0 {
		t.Fatalf("over %d seeds: %d requested runs started (%d with overlap allow beside a live run) and %d instants skipped as paused; the operator is not exercised",
			seeds, manual, beside, paused)
	}
	t.Logf("over %d seeds: %d requested runs started (%d with overlap allow beside a live run), %d instants skipped as paused", seeds, manual, beside, paused)
}

// TestRunSemanticsAreExplored guards the workload's part of the sweep:
// under the faults, failed attempts are retried inside their run, runs
// wait for the live one (buffer-one) and replace it (replace), and
// instants missed in an outage are caught up in turn (run-all), so each
// is explored, not merely configured.
func TestRunSemanticsAreExplored(t *testing.T) {
	heavy(t)
	var retries, retried, waited, replaced, seeds int
	for seed := uint64(1); seed <= 40; seed++ {
		synctest.Test(t, func(t *testing.T) {
			res := exploredSeed(t, seed)
			seeds++
			grants := map[string]history.Event{}
			for _, e := range res.Events {
				switch {
				case e.Kind == history.Grant:
					grants[e.Token] = e
				case e.Kind == history.End && e.Status == claim.Retrying:
					retries++
				case e.Kind == history.Start && e.Run.Job == "flaky" && grants[e.Token].Attempt > 1:
					retried++
				case e.Kind == history.Start && e.Run.Job == "queue" && e.At.Sub(grants[e.Token].At) > 200*time.Millisecond:
					waited++
				case e.Kind == history.Skip && e.Reason == runner.ReasonReplaced:
					replaced++
				}
			}
		})
	}
	if retries < seeds || retried < seeds || waited < seeds || replaced < seeds {
		t.Fatalf("over %d seeds: %d attempts failed and retried, %d retries started, %d buffer-one runs waited, %d runs replaced; the run semantics are not exercised",
			seeds, retries, retried, waited, replaced)
	}
	t.Logf("over %d seeds: %d attempts failed and retried, %d retries started, %d buffer-one runs waited, %d runs replaced",
		seeds, retries, retried, waited, replaced)
}

// TestBackfillsAreExplored guards the backfills' part of the sweep: the
// operator's backfills run instants (and reruns) under the faults, some
// are killed with their replica's host mid-run, and a backfill run again
// resumes what one before it left live (a takeover, attempt > 1, by a
// backfill process). That every backfill settles is each seed's
// violation to report (BackfillUnsettled).
func TestBackfillsAreExplored(t *testing.T) {
	heavy(t)
	var backfills, started, resumed, killed, givenUp, fleetTook, seeds int
	for seed := uint64(1); seed <= 200; seed++ {
		synctest.Test(t, func(t *testing.T) {
			res := exploredSeed(t, seed)
			seeds++
			backfills += res.Backfills
			givenUp += res.BackfillsLeft
			byBackfill := map[string]bool{}
			for _, e := range res.Events {
				if !strings.Contains(e.Replica, ".backfill") {
					if e.Kind == history.Start && e.Attempt > 1 && byBackfill[e.Run.ID()] && !strings.Contains(e.Replica, ".") {
						fleetTook++
					}
					continue
				}
				if e.Kind == history.Grant {
					byBackfill[e.Run.ID()] = true
				}
				switch {
				case e.Kind == history.Start && e.Attempt > 1:
					resumed++
					fallthrough
				case e.Kind == history.Start:
					started++
				case e.Kind == history.Crash:
					killed++
				}
			}
		})
	}
	// (The patient job, stop 49, took some of the backfills' runs: 98 in
	// 200 seeds, where half was the floor before.)
	if backfills < seeds/4 || started < seeds*2/5 || resumed < 5 || killed < 5 || givenUp < 5 || fleetTook < 5 {
		t.Fatalf("over %d seeds: %d backfills, %d runs started by them, %d of those resumed, %d backfills killed mid-run, %d given up with runs left, %d of their runs taken over by the fleet; backfills are not exercised",
			seeds, backfills, started, resumed, killed, givenUp, fleetTook)
	}
	t.Logf("over %d seeds: %d backfills, %d runs started by them, %d of those resumed, %d backfills killed mid-run, %d given up with runs left, %d of their runs taken over by the fleet",
		seeds, backfills, started, resumed, killed, givenUp, fleetTook)
}

// TestTriggersHereAreExplored guards the `trigger --here` part of the
// sweep: the operator's triggers start runs under the faults, some die
// with their replica mid-run, and the fleet takes such a run over (a
// Start by a replica, attempt > 1, of a run a trigger process started),
// though no replica dispatched it. That every run ends is each seed's
// invariant to hold (abandoned).
func TestTriggersHereAreExplored(t *testing.T) {
	heavy(t)
	var heres, withPod, alone, started, takenOver, seeds int
	for seed := uint64(1); seed <= 200; seed++ {
		synctest.Test(t, func(t *testing.T) {
			res := exploredSeed(t, seed)
			seeds++
			heres += res.Heres
			withPod += res.HeresKilled
			alone += res.HeresKilledAlone
			byHere := map[string]bool{}
			for _, e := range res.Events {
				switch {
				case e.Kind != history.Start:
				case strings.Contains(e.Replica, ".here"):
					started++
					byHere[e.Run.ID()] = true
				case byHere[e.Run.ID()] && !strings.Contains(e.Replica, "."):
					takenOver++
				}
			}
		})
	}
	if heres < seeds/3 || started < seeds/4 || withPod < 5 || alone < 5 || takenOver < 20 {
		t.Fatalf("over %d seeds: %d triggers, %d runs started by them, %d died with their replica's crash or stop, %d killed alone, %d of their runs taken over by the fleet; triggers are not exercised",
			seeds, heres, started, withPod, alone, takenOver)
	}
	t.Logf("over %d seeds: %d triggers, %d runs started by them, %d died with their replica's crash or stop, %d killed alone, %d of their runs taken over by the fleet",
		seeds, heres, started, withPod, alone, takenOver)
}
