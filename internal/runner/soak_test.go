package runner_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
	"github.com/scheduler-dev/scheduler/job"
)

// TestSoak runs 3 replicas × 50 per-second jobs on one claimer for
// $SCHEDULER_SOAK (a duration; unset: skipped) and reports heap, goroutines
// and open sockets at the start and the end, every minute in between. Not
// part of CI:
//
//	SCHEDULER_SOAK=10m SCHEDULER_SOAK_CLAIMER=postgres go test -run TestSoak -timeout 0 -v ./internal/runner/
//
// SCHEDULER_SOAK_CLAIMER is one of backends.Kinds (default redis). Every
// fifth job works 2s (renewed on a 3s lease), the others 20ms. It fails if
// an instant ran twice or not at all, or if goroutines or sockets grew
// after the first minute (when pools have reached their working size).
func TestSoak(t *testing.T) {
	span, err := time.ParseDuration(os.Getenv("SCHEDULER_SOAK"))
	if err != nil || span <= 0 {
		t.Skip("soak test: set SCHEDULER_SOAK to a duration, e.g. SCHEDULER_SOAK=10m")
	}
	testenv.WallClock(t)
	kind := os.Getenv("SCHEDULER_SOAK_CLAIMER")
	if kind == "" {
		kind = "redis"
	}
	const replicas, jobsN = 3, 50
	open := backends.Open(t, kind)

	var mu sync.Mutex
	started := map[string]int{}
	succeeded := map[string]int{}
	handler := func(work time.Duration) job.Handler {
		return func(ctx context.Context, run job.Run) error {
			mu.Lock()
			started[run.ID]++
			mu.Unlock()
			select {
			case <-time.After(work):
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
			succeeded[run.ID]++
			mu.Unlock()
			return nil
		}
	}
	var jobs []runner.Job
	for i := range jobsN {
		work := 20 * time.Millisecond
		if i%5 == 0 {
			work = 2 * time.Second
		}
		jobs = append(jobs, runner.Job{Name: fmt.Sprintf("soak.%02d", i), Schedule: mustSchedule(t, "* * * * * *"),
			Handler: handler(work), Overlap: runner.OverlapAllow})
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range replicas {
		name := fmt.Sprintf("r%d", i)
		r, err := runner.New(runner.Options{Claimer: open(name), ClaimerName: kind, Instance: name,
			Lease: 3 * time.Second, ShutdownGrace: 5 * time.Second}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	time.Sleep(10 * time.Second) // warm-up: pools filled, caches loaded
	first := sample()
	t.Logf("soak on %s for %v: start: %s", kind, span, first)
	// Pools grow to their working size within the first minute; growth
	// after that is a leak.
	base, slack := first, 25
	deadline := time.Now().Add(span)
	for minute := 1; time.Now().Before(deadline); minute++ {
		time.Sleep(min(time.Minute, time.Until(deadline))) // the soak is wall time
		s := sample()
		t.Logf("%v: %s", time.Since(begin).Round(time.Second), s)
		if minute == 1 {
			base, slack = s, 5
		}
	}
	last := sample()
	end := time.Now()
	cancel()
	wg.Wait()
	t.Logf("end: %s", last)
	t.Logf("after shutdown: %s", sample())

	mu.Lock()
	defer mu.Unlock()
	sched := mustSchedule(t, "* * * * * *")
	var instants, twice, lost int
	for at := sched.Next(begin.Add(2 * time.Second)); at.Before(end.Add(-5 * time.Second)); at = sched.Next(at) {
		for _, j := range jobs {
			id := claim.Run{Job: j.Name, At: at}.ID()
			instants++
			switch n := succeeded[id]; {
			case n > 1 || started[id] > 1:
				twice++
			case n == 0:
				lost++
			}
		}
	}
	t.Logf("%d runs checked: %d ran twice, %d lost", instants, twice, lost)
	if twice > 0 || lost > 0 {
		t.Errorf("%d runs ran twice and %d were lost, of %d", twice, lost, instants)
	}
	if last.goroutines > 2*base.goroutines+50 || last.sockets > base.sockets+slack {
		t.Errorf("grew from %s to %s", base, last)
	}
}

type soakSample struct {
	heapMB              float64
	goroutines, sockets int
}

func (s soakSample) String() string {
	return fmt.Sprintf("heap %.1f MiB, %d goroutines, %d sockets", s.heapMB, s.goroutines, s.sockets)
}

// sample reads the live heap after a GC, the goroutine count and the
// process's open sockets (Linux: /proc/self/fd).
func sample() soakSample {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s := soakSample{heapMB: float64(m.HeapAlloc) / (1 << 20), goroutines: runtime.NumGoroutine()}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		for _, fd := range fds {
			if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:") {
				s.sockets++
			}
		}
	}
	return s
}
