package explore

import (
	"flag"
	"fmt"
	"testing"
	"testing/synctest"
)

var (
	seeds = flag.Int("explore.seeds", 200, "how many seeds TestExplore sweeps")
	first = flag.Uint64("explore.first", 1, "the first seed TestExplore sweeps (replay one: -explore.first=N -explore.seeds=1)")
	show  = flag.Bool("explore.show", false, "log every seed's plan and verdict")
)

// TestExplore sweeps seeds of composed faults over the runner and fails
// with each violation's seed and trace. CI pins the sweep (see .ci/run);
// replay a failure with -explore.first=SEED -explore.seeds=1.
func TestExplore(t *testing.T) {
	for seed := *first; seed < *first+uint64(*seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				res, err := Run(Config{Seed: seed})
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Violations) > 0 {
					t.Errorf("seed %d: %d violations\n%s", seed, len(res.Violations), res.Report())
				} else if *show {
					t.Log(res.Report())
				}
			})
		})
	}
}
