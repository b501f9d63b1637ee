package explore

import (
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/schedule"
)

// TestMixedConfigsAreExplored guards the mixed configs' part of the
// sweep: on some seeds some replicas run a second version of a job's
// schedule, and runs of both versions start under the faults: with a
// changed spec, instants only the first version names and instants only
// the second names; with a changed zone, runs on replicas of each version.
// history.Check holds every run to once, and to an instant one version
// names.
func TestMixedConfigsAreExplored(t *testing.T) {
	heavy(t)
	specs := map[string]string{}
	for _, j := range (&world{cfg: Config{Lease: 3 * time.Second}}).workload() {
		specs[j.name] = j.spec
	}
	var seeds, specSeeds, bothSpecs, zoneSeeds, bothZones int
	for seed := uint64(1); seed <= 40; seed++ {
		synctest.Test(t, func(t *testing.T) {
			res := exploredSeed(t, seed)
			seeds++
			m := res.Mixed
			if m == nil {
				return
			}
			first, err1 := schedule.Parse(specs[m.Job], "UTC")
			second, err2 := schedule.Parse(m.Spec, m.TZ)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: %v %v", m, err1, err2)
			}
			var firstOnly, secondOnly, onFirst, onSecond int
			for _, e := range res.Events {
				if e.Kind != history.Start || e.Run.Job != m.Job || e.Run.At.Nanosecond() != 0 {
					continue
				}
				byFirst, bySecond := names(first, e.Run.At), names(second, e.Run.At)
				switch {
				case byFirst && !bySecond:
					firstOnly++
				case bySecond && !byFirst:
					secondOnly++
				}
				if slices.ContainsFunc(m.Replicas, func(i int) bool { return e.Replica == fmt.Sprintf("r%d", i+1) }) {
					onSecond++
				} else {
					onFirst++
				}
			}
			if m.TZ == "UTC" {
				specSeeds++
				if firstOnly > 0 && secondOnly > 0 {
					bothSpecs++
				}
			} else {
				zoneSeeds++
				if onFirst > 0 && onSecond > 0 {
					bothZones++
				}
			}
		})
	}
	if specSeeds < seeds/8 || zoneSeeds == 0 || bothSpecs < specSeeds/2 || bothZones < zoneSeeds/2 {
		t.Fatalf("over %d seeds: %d with a changed spec (%d ran instants of both), %d with a changed zone (%d ran on both versions); mixed configs are not exercised",
			seeds, specSeeds, bothSpecs, zoneSeeds, bothZones)
	}
	t.Logf("over %d seeds: %d with a changed spec (%d ran instants only one version names, of each), %d with a changed zone (%d ran on replicas of each)",
		seeds, specSeeds, bothSpecs, zoneSeeds, bothZones)
}
