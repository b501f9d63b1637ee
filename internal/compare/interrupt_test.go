package compare_test

import (
	"context"
	"html"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/compare"
)

// A compare stopped mid-cell (Ctrl-C) stops every cell at once, the
// explorer's random one too (it ran to its end, then said OK and exited
// 0), and reports each as interrupted. A scripted cell judges only the
// runs that had their chance before the stop: the rest of its steady
// window used to be reported missed, and the backend blamed. Found by an
// outside review.
func TestAnInterruptedCompareStopsEveryCellAndInventsNoMisses(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		select {
		case <-time.After(10 * time.Second):
			cancel()
		case <-ctx.Done():
		}
	}()
	start := time.Now()
	rep, err := compare.Run(ctx, compare.Options{Claimers: []string{"memory"}, Faults: []string{"none", compare.FaultRandom},
		Replicas: 3, Jobs: 6, Duration: 40 * time.Second, Lease: time.Second, MaxClockSkew: 500 * time.Millisecond, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 25*time.Second {
		t.Errorf("the compare stopped after 10s ended %v after its start; its cells run 40s", d.Round(time.Second))
	}
	if rep.OK {
		t.Error("an interrupted compare reported OK")
	}
	for _, c := range rep.Cells {
		if c.Status != compare.StatusError || !strings.Contains(c.Reason, "interrupted") {
			t.Errorf("%s × %s: %s %q, want an error saying it was interrupted", c.Claimer, c.Fault, c.Status, c.Reason)
		}
		if c.MissedRuns != 0 || c.DuplicateExecutions != 0 || len(c.Violations) != 0 {
			t.Errorf("%s × %s: %d missed, %d duplicated, violations %q on the memory claimer without faults; want none (missed: %v)",
				c.Claimer, c.Fault, c.MissedRuns, c.DuplicateExecutions, c.Violations, c.MissedRunIDs)
		}
		if c.Fault == "none" && (c.RunsExpected == 0 || !slices.ContainsFunc(c.Notes, func(n string) bool { return strings.HasPrefix(n, "interrupted ") })) {
			t.Errorf("none: %d runs judged, notes %q; want the runs due before the stop judged, and a note saying when it was cut", c.RunsExpected, c.Notes)
		}
	}
}

// The replay command a random cell prints draws the same plan again: it
// carries every flag the plan depends on (it said only the claimer and
// the seed, and drew another plan at the default replicas, lease, skew
// and duration). Found by an outside review.
func TestARandomCellsReplayCommandDrawsItsPlanAgain(t *testing.T) {
	args := []string{"--claimers", "memory", "--faults", "random", "--seed", "5", "--replicas", "4",
		"--lease", "500ms", "--max-clock-skew", "200ms", "--duration", "9s"}
	first := compareCLI(t, t.TempDir(), "first", args...)
	if first.reportError != nil || len(first.report.Cells) != 1 {
		t.Fatalf("first compare: exit %d, %v\n%s", first.code, first.reportError, first.stderr)
	}
	// It measures no claim latency: the table says so, not "0µs/0µs".
	if strings.Contains(first.stdout, "0µs/0µs") {
		t.Errorf("the random cell's row shows a claim latency it never measured:\n%s", first.stdout)
	}
	plan, replay := "", ""
	for _, n := range first.report.Cells[0].Notes {
		switch {
		case strings.HasPrefix(n, "nemesis "):
			plan = n
		case strings.HasPrefix(n, "replay: scheduler compare "):
			replay = strings.TrimPrefix(n, "replay: scheduler compare ")
		}
	}
	if plan == "" || replay == "" {
		t.Fatalf("the random cell's notes %q lack its plan or its replay command", first.report.Cells[0].Notes)
	}
	if page, err := os.ReadFile(first.html); err != nil || !strings.Contains(string(page), html.EscapeString(plan)) {
		t.Errorf("the HTML report (%v) lacks the random cell's plan %q", err, plan)
	}
	again := compareCLI(t, t.TempDir(), "again", strings.Fields(replay)...)
	if again.reportError != nil || len(again.report.Cells) != 1 {
		t.Fatalf("replay %q: exit %d, %v\n%s", replay, again.code, again.reportError, again.stderr)
	}
	if !slices.Contains(again.report.Cells[0].Notes, plan) {
		t.Errorf("replay %q drew another plan:\n%q\nwant\n%s", replay, again.report.Cells[0].Notes, plan)
	}
}

// A compare whose every cell was skipped (postgres without a DSN: a CI
// job whose variable came out empty) fails instead of passing the gate
// on nothing. Found by an outside review.
func TestACompareThatRanNoCellFails(t *testing.T) {
	r := compareCLI(t, t.TempDir(), "none", "--claimers", "postgres", "--faults", "none", "--duration", "10s", "--lease", "1s")
	if r.code != 1 || r.report.OK || !strings.Contains(r.stdout, "no cell ran") {
		t.Errorf("exit %d, ok %v, stdout\n%s\nwant 1 and that no cell ran", r.code, r.report.OK, r.stdout)
	}
}
