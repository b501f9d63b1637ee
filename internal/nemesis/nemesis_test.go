package nemesis

import (
	"slices"
	"testing"
	"time"
)

func TestPlansComposeDistinctClassesAndReplay(t *testing.T) {
	p := Params{Replicas: 4, Lease: time.Second, MaxSkew: 250 * time.Millisecond, From: time.Second, To: 5 * time.Second, Extra: 2}
	for seed := uint64(1); seed <= 200; seed++ {
		plan := New(seed, p)
		if n := len(plan.Classes()); n < 5 {
			t.Fatalf("seed %d: %d classes, want at least 5: %s", seed, n, plan)
		}
		if slices.Contains(plan.Classes(), Restart) {
			t.Fatalf("seed %d: restart drawn though not asked for: %s", seed, plan)
		}
		for _, op := range plan.Ops {
			if op.At < p.From || op.At >= p.To || op.For <= 0 {
				t.Fatalf("seed %d: %s outside [%v, %v) or empty", seed, op, p.From, p.To)
			}
			if op.Kind == Clock && op.Shift.Abs() <= p.MaxSkew {
				t.Fatalf("seed %d: %s is within max_clock_skew", seed, op)
			}
		}
		if again := New(seed, p); again.String() != plan.String() {
			t.Fatalf("seed %d drew two plans:\n%s\n%s", seed, plan, again)
		}
	}
}
