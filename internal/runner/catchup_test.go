package runner_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// An outage far longer than the recorded-missed cap (an @every 1s job
// down for 5h: 18,000 instants) still catches up the newest max_catchup
// instants, oldest first, and records the cap's worth before them missed.
func TestCatchUpAfterAnOutageLongerThanTheMissedCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		jobs := []runner.Job{{Name: "often", Schedule: mustSchedule(t, "@every 1s"), Misfire: runner.MisfireRunAll,
			MaxCatchup: 3, Grace: time.Hour, Handler: func(ctx context.Context, run job.Run) error { return nil }}}
		rs := startReplicas(t, store, led, jobs, "a")
		time.Sleep(3 * time.Second)
		stopAll(rs)
		time.Sleep(5 * time.Hour)
		up := time.Now()
		rs = startReplicas(t, store, led, jobs, "a", "b", "c")
		time.Sleep(5 * time.Second)
		stopAll(rs)

		var caught []time.Time
		for _, x := range led.events(history.Start) {
			for _, s := range x {
				if !s.Run.At.After(up) && !s.At.Before(up) {
					caught = append(caught, s.Run.At)
				}
			}
		}
		slices.SortFunc(caught, time.Time.Compare)
		want := []time.Time{up.Truncate(time.Second).Add(-2 * time.Second), up.Truncate(time.Second).Add(-time.Second), up.Truncate(time.Second)}
		if len(caught) != 3 || !caught[0].Equal(want[0].UTC()) || !caught[2].Equal(want[2].UTC()) {
			t.Errorf("caught up %v, want the newest 3 instants before the restart %v", caught, want)
		}
		sts := statuses(t, store, "often")
		// Right before the ones caught up, none is left unrecorded.
		for at := want[0].Add(-100 * time.Second).UTC(); at.Before(want[0]); at = at.Add(time.Second) {
			if sts[at] != claim.Missed {
				t.Errorf("%s: %q, want recorded missed", at.Format(time.TimeOnly), sts[at])
			}
		}
		missed := 0
		for _, st := range sts {
			if st == claim.Missed {
				missed++
			}
		}
		// Each replica that starts records up to 10,000 before the
		// newest record it read, so three may record a few thousand more.
		if missed < 10_000 || missed > 3*10_000 {
			t.Errorf("%d instants recorded missed, want from the cap, 10,000, to three times it", missed)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"often": true}})
	})
}
