package explore

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/nemesis"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

var (
	long     = flag.Duration("explore.long", 0, "TestLongExploration: how long to explore every claimer's real backend with fresh seeds (0: skip)")
	longSeed = flag.Uint64("explore.long-seed", uint64(time.Now().UnixNano()%1e9), "TestLongExploration: the first seed")
	longOut  = flag.String("explore.long-out", "", "TestLongExploration: write the claimer × fault table (markdown) here")
	// A seed's faults land at other moments of its runs' lives on another
	// time scale: redis seed 50000029 broke one invariant at 1s a lease
	// and another at 2s (TestNemesisOnRealBackends' scale).
	longScale = flag.Int("explore.long-scale", 1, "TestLongExploration: the time scale, in seconds a lease (etcd: at least 2)")
)

// TestLongExploration explores every claimer's real backend for
// -explore.long with fresh seeds, one claimer per goroutine, and reports
// per claimer the seeds run, the faults applied by class, the runs and
// the violations by invariant: the table docs/explore.md and the README
// show. CI runs the pinned seeds of TestNemesisOnRealBackends instead.
func TestLongExploration(t *testing.T) {
	if *long == 0 {
		t.Skip("set -explore.long=30m to explore")
	}
	testenv.WallClock(t)
	type tally struct {
		seeds, expected, executions, events int
		faults                              map[string]int
		violations                          map[string]int
		failed                              []string
	}
	tallies := map[string]*tally{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(*long)
	kinds := allKinds()
	if *realKinds != "" {
		kinds = strings.Split(*realKinds, ",")
	}
	for k, kind := range kinds {
		tl := &tally{faults: map[string]int{}, violations: map[string]int{}}
		tallies[kind] = tl
		wg.Go(func() {
			for i := uint64(0); time.Now().Before(end); i++ {
				seed := *longSeed + uint64(k)*1_000_000 + i
				var res *Result
				var err error
				var runnerLog *testenv.Logs
				t.Run(fmt.Sprintf("%s/%d", kind, seed), func(t *testing.T) {
					cfg := realConfig(t, kind, seed, time.Duration(*longScale))
					runnerLog = logRunners(&cfg)
					res, err = Run(cfg)
				})
				if res == nil && err == nil {
					// The subtest stopped before a result: its backend is
					// missing (skipped, or failed under
					// SCHEDULER_TEST_REQUIRE_SERVICES). Every later seed
					// would stop the same way.
					mu.Lock()
					tl.failed = append(tl.failed, fmt.Sprintf("seed %d: no result (the backend is unavailable)", seed))
					mu.Unlock()
					return
				}
				mu.Lock()
				if err != nil {
					tl.failed = append(tl.failed, fmt.Sprintf("seed %d: %v", seed, err))
				} else {
					tl.seeds++
					tl.expected += res.Expected
					tl.events += len(res.Events)
					for _, e := range res.Events {
						if e.Kind == history.Start {
							tl.executions++
						}
					}
					for _, op := range res.Plan.Ops {
						tl.faults[op.Kind]++
					}
					for _, v := range res.Violations {
						tl.violations[v.Invariant]++
					}
					if len(res.Violations) > 0 {
						tl.failed = append(tl.failed, res.Report())
						writeTrace(t, kind, res, runnerLog)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	var b strings.Builder
	lease := time.Duration(*longScale) * time.Second
	fmt.Fprintf(&b, "Long exploration: %v per claimer, seeds from %d (claimer k: %d + k×1,000,000 + i), lease %v, max_clock_skew %v (etcd: at least 2s and 500ms).\n\n",
		*long, *longSeed, *longSeed, lease, lease/4)
	classes := append(slices.Clone(nemesis.Classes), nemesis.Refuse, nemesis.Rewind)
	fmt.Fprintf(&b, "| claimer | seeds | %s | runs expected | executions | violations |\n|---|---:|%s---:|---:|---|\n",
		strings.Join(classes, " | "), strings.Repeat("---:|", len(classes)))
	for _, kind := range kinds {
		tl := tallies[kind]
		var cells []string
		for _, c := range classes {
			cells = append(cells, fmt.Sprint(tl.faults[c]))
		}
		v := "0"
		if len(tl.violations) > 0 {
			var parts []string
			for inv, n := range tl.violations {
				parts = append(parts, fmt.Sprintf("%s %d", inv, n))
			}
			slices.Sort(parts)
			v = strings.Join(parts, ", ")
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %s |\n", kind, tl.seeds, strings.Join(cells, " | "), tl.expected, tl.executions, v)
	}
	t.Log("\n" + b.String())
	if *longOut != "" {
		if err := os.WriteFile(*longOut, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, kind := range kinds {
		for _, f := range tallies[kind].failed {
			t.Errorf("%s: %s", kind, f)
		}
	}
}
