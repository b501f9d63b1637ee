package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/runner"
)

// A backfill stopped before it reached all its planned runs says how many
// it ran and what the rest need; one that ran them all, or a dry run,
// says so as before.
func TestBackfillSummarySaysWhatAStoppedBackfillLeftUnstarted(t *testing.T) {
	from := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	o := runner.BackfillOptions{From: from, To: from.Add(9 * time.Hour)}
	for _, tc := range []struct {
		name        string
		dry         bool
		sum         runner.BackfillSummary
		want, never []string
	}{
		{"all ran", false, runner.BackfillSummary{Instants: 10, Planned: 10, Settled: 10, Succeeded: 10},
			[]string{"; ran 10, kept 0"}, []string{"not started", "interrupted"}},
		{"dry run", true, runner.BackfillSummary{Instants: 10, Planned: 7, Kept: 3},
			[]string{"; would run 7, kept 3"}, []string{"not started"}},
		{"stopped", false, runner.BackfillSummary{Instants: 10, Planned: 10, Settled: 4, Succeeded: 1, Interrupted: 3},
			[]string{"; ran 4 of 10 planned,", "3 interrupted mid-run", "6 not started: the backfill stopped first; run the same backfill again"},
			[]string{"ran 10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o.DryRun = tc.dry
			got := backfillSummary("billing.nightly", o, tc.sum)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("summary lacks %q:\n%s", w, got)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(got, n) {
					t.Errorf("summary says %q:\n%s", n, got)
				}
			}
		})
	}
}
