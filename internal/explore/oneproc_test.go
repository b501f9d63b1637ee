package explore

import (
	"runtime"
	"testing"
)

// oneProc runs t and its subtests on one P (GOMAXPROCS 1) under the race
// detector, and restores the setting once they have all ended.
//
// Go 1.26's runtime runs every timer of a synctest bubble under one race
// context per bubble (time.go, unlockAndRun: gp.racectx =
// bubble.timers.raceCtx), while a bubble's timers can fire on two Ms at
// once: the bubble's own advance of time and a goroutine that reads an
// expired timer channel. The race runtime's per-context state is not
// safe for that, and twice in CI the package crashed with SIGSEGV inside
// the race runtime (__sanitizer StackDepot Put, on the system stack of
// synctest.Run, during its timers check), after about two minutes of
// bubbles full of context deadlines and AfterFuncs. With one P no two Ms
// run Go code at once. The race detector judges happens-before, not
// actual overlap, so it finds the same races on one P.
//
// Call it at the top of a top-level test whose bubbles are many; the
// package's top-level tests run one after another, so the setting never
// reaches the real-time nemesis test.
func oneProc(t *testing.T) {
	if !raceEnabled {
		return
	}
	prev := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
}
