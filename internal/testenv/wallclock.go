package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// WallClock marks t as a heavy wall-clock test: several replicas, leases of
// a few seconds, faults that last for wall time, and assertions that hold
// only while the process gets the CPU a lease assumes. It waits until no
// other such test runs on this machine, in this test binary or another,
// then holds the machine until t ends.
//
// go test runs packages' test binaries side by side (-p defaults to the
// number of CPUs). On a 2-core machine two of these tests together starve
// each other's timers by more than the trust margins they assert on, and
// fail for the machine's sake rather than the code's. Serialising them
// costs the sum of their durations and keeps every other test parallel.
//
// Call it at the top of a top-level test, before t.Parallel's subtests
// start; never from a subtest of a test that holds it (the lock is per
// open file, so that would wait forever).
func WallClock(t testing.TB) {
	t.Helper()
	holdMachine(t, lockFile, "exclusive", "other wall-clock and CPU-heavy tests")
}

// CPUHeavy marks t as a test that keeps a core or more busy for a long
// while (thousands of seeded histories under the race detector), but
// asserts nothing on wall time: it runs beside other such tests, never
// beside a wall-clock test, whose replicas would go without the CPU
// their leases assume. (On two cores a wall-clock test beside the
// explorer's in-process seeds saw stalls of a second and more, and
// failed for the machine's sake: a takeover of a run whose holder's
// renewals were starved.) Same rules as WallClock: top-level tests only,
// and never in a test that calls WallClock.
func CPUHeavy(t testing.TB) {
	t.Helper()
	holdMachine(t, shareFile, "shared", "wall-clock tests")
}

// holdMachine takes the machine-wide test lock with lock (how: exclusive
// or shared), until t ends.
func holdMachine(t testing.TB, lock func(*os.File) error, how, others string) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "scheduler-test-wallclock.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("wall-clock lock: %v", err)
	}
	start := time.Now()
	if err := lock(f); err != nil {
		_ = f.Close()
		t.Fatalf("wall-clock lock %s: %v", path, err)
	}
	waited := time.Since(start)
	if waited > time.Second {
		t.Logf("waited %v for %s to finish", waited.Round(time.Millisecond), others)
	}
	held := time.Now()
	t.Cleanup(func() {
		_ = f.Close() // closing the file releases the lock
		logHold(t.Name(), how, waited, time.Since(held))
		if step := clockStep(held); t.Failed() && (step > maxStep || step < -maxStep) {
			t.Logf("the wall clock moved %v against the monotonic clock during this test: leases that backends date "+
				"on the wall clock (SQLite, PostgreSQL, Redis) ended that much early or late, as the history checker, "+
				"which times events on the monotonic clock, saw them", step)
		}
	})
}

// maxStep is how far the wall clock may drift from the monotonic one
// over a test before a failure names it: NTP's slew is at most 500 ppm,
// 30ms over a minute, so more than that is a step.
const maxStep = 30 * time.Millisecond

// clockStep is how far the wall clock moved against the monotonic clock
// since t0 (a time.Now reading): zero unless the wall clock was stepped
// or slewed meanwhile.
func clockStep(t0 time.Time) time.Duration {
	now := time.Now()
	return now.Round(0).Sub(t0.Round(0)) - now.Sub(t0)
}

// logHold appends a line to the file SCHEDULER_TEST_LOCK_LOG names, if
// set: the test, how it held the machine (exclusive or shared), how long
// it waited and how long it held it. The machine-wide lock serialises the
// wall-clock tests, so their holds add up to most of the suite's time;
// .ci/run prints the longest. The lines of concurrent test binaries do not
// interleave: each is one short append.
func logHold(name, how string, waited, held time.Duration) {
	path := os.Getenv("SCHEDULER_TEST_LOCK_LOG")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = fmt.Fprintf(f, "%.1f\t%.1f\t%s\t%s\n", held.Seconds(), waited.Seconds(), how, name)
}
