package testenv

import (
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
	path := filepath.Join(os.TempDir(), "scheduler-test-wallclock.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("wall-clock lock: %v", err)
	}
	start := time.Now()
	if err := lockFile(f); err != nil {
		_ = f.Close()
		t.Fatalf("wall-clock lock %s: %v", path, err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("waited %v for other wall-clock tests to finish", waited.Round(time.Millisecond))
	}
	t.Cleanup(func() { _ = f.Close() }) // closing the file releases the lock
}
