package compare

import (
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
)

func TestWrapRecordsEachGrantOfABatch(t *testing.T) {
	store := memory.NewStore(nil)
	rec := newRecorder(time.Now())
	c := &cell{stop: make(chan struct{})}
	rep := &replica{id: "r1", c: c, dead: make(chan struct{})}
	w := wrap(memory.New(store, "r1"), rep, rec)
	at := time.Now().Truncate(time.Second)
	taken := claim.Run{Job: "a", At: at}
	if _, err := claim.ClaimOne(t.Context(), memory.New(store, "r0"), taken, time.Minute); err != nil {
		t.Fatal(err)
	}
	runs := []claim.Run{taken, {Job: "b", At: at}, {Job: "c", At: at}}
	cls, errs := w.Claim(t.Context(), runs, time.Minute)
	if !errors.Is(errs[0], claim.ErrHeld) || cls[1] == nil || cls[2] == nil {
		t.Fatalf("batch = %v, %v", cls, errs)
	}
	if rec.calls != 1 || len(rec.claimLat) != 1 || len(rec.grants) != 2 || len(rec.runs) != 3 {
		t.Fatalf("recorded %d calls, %d latencies, %d grants, %d runs; want 1, 1, 2, 3", rec.calls, len(rec.claimLat), len(rec.grants), len(rec.runs))
	}
	if g := rec.grantOf("r1", runs[2].ID()); g == nil || g.token != cls[2].Token || g.seq != 2 {
		t.Fatalf("grant of %s = %+v", runs[2].ID(), g)
	}
}

// TestDuplicateRule pins down when a second execution of a run counts as a
// duplicate: only when it was granted while an earlier grant was valid.
func TestDuplicateRule(t *testing.T) {
	const lease = time.Second
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	run := claim.Run{Job: "tick.01", At: t0.Truncate(time.Second)}
	first := func() *grant {
		return &grant{seq: 1, run: run, id: run.ID(), replica: "r1", token: "a", attempt: 1, granted: at(1),
			confirmed: at(0), lease: lease, started: at(2)}
	}
	for _, tc := range []struct {
		name      string
		edit      func(g *grant) // what became of the first grant
		second    int            // ms the second grant arrived
		dup, take int
	}{
		{"GrantedAfterTheLeaseRanOutIsATakeover", func(g *grant) {}, 1100, 0, 1},
		{"GrantedWhileTheLeaseRanIsADuplicate", func(g *grant) {}, 900, 1, 0},
		{"GrantedAfterARenewalIsADuplicate", func(g *grant) { g.confirmed = at(600) }, 1100, 1, 0},
		{"GrantedAfterAnInterruptedReleaseIsATakeover", func(g *grant) { g.released, g.outcome = at(300), claim.Interrupted }, 400, 0, 1},
		{"GrantedAfterASuccessIsADuplicate", func(g *grant) { g.released, g.outcome = at(300), claim.Succeeded }, 5000, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := newWorkload(3, lease)
			if err != nil {
				t.Fatal(err)
			}
			c := &cell{o: &Options{MaxClockSkew: time.Second, Duration: time.Second}, lease: lease, work: w,
				rec: newRecorder(t0), store: newFencedStore(), t0: t0}
			g := first()
			tc.edit(g)
			c.rec.grants["a"] = g
			c.rec.grants["b"] = &grant{seq: 2, run: run, id: run.ID(), replica: "r2", token: "b", attempt: 2,
				granted: at(tc.second), confirmed: at(tc.second - 1), lease: lease, started: at(tc.second + 1)}
			res := &Cell{}
			c.analyze(res)
			if res.DuplicateExecutions != tc.dup || res.Takeovers != tc.take || res.Executions != 2 {
				t.Fatalf("%d executions, %d duplicates, %d takeovers; want 2, %d, %d (%v)",
					res.Executions, res.DuplicateExecutions, res.Takeovers, tc.dup, tc.take, res.DuplicateDetails)
			}
		})
	}
}
