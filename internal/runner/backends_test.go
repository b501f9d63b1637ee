package runner_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
	"github.com/scheduler-dev/scheduler/job"
)

// lagLog collects the schedule lag (instant → handler start, on the
// starting replica's clock) of every execution, for the closing report.
type lagLog struct {
	mu   sync.Mutex
	lags map[string]time.Duration
}

func (l *lagLog) add(id string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lags == nil {
		l.lags = map[string]time.Duration{}
	}
	l.lags[id] = d
}

// worst reports the median and worst lag over the given runs.
func (l *lagLog) worst(ids []string) (p50, max time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s []time.Duration
	for _, id := range ids {
		s = append(s, l.lags[id])
	}
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0, 0
	}
	return s[len(s)/2], s[len(s)-1]
}

// TestReplicasOnRealBackends runs replicas as goroutines, each with its own
// client, skewed clock and start time, on every claimer's real backend:
// every instant runs exactly once and none is missed.
func TestReplicasOnRealBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock test: 35s")
	}
	testenv.WallClock(t)
	scenarios := []struct {
		spec     string
		replicas int
		startGap time.Duration
		span     time.Duration
	}{
		{"* * * * * *", 4, 400 * time.Millisecond, 32 * time.Second},
		{"@every 3s", 3, 2 * time.Second, 32 * time.Second},
	}
	// The scenarios sleep through wall-clock instants, so they all run at
	// once rather than under -parallel's limit of GOMAXPROCS.
	var all sync.WaitGroup
	defer all.Wait()
	for _, kind := range backends.Kinds {
		for _, sc := range scenarios {
			all.Go(func() {
				t.Run(kind+"/"+sc.spec, func(t *testing.T) {
					open := backends.Open(t, kind)
					led := newLedger()
					lags := &lagLog{}
					jobs := []runner.Job{{Name: "tick", Schedule: mustSchedule(t, sc.spec),
						Handler: func(ctx context.Context, run job.Run) error {
							lags.add(run.ID, time.Since(run.ScheduledAt))
							select {
							case <-time.After(100 * time.Millisecond): // a little work
							case <-ctx.Done():
							}
							return nil
						}}}
					skews := []time.Duration{0, 400 * time.Millisecond, -450 * time.Millisecond, 200 * time.Millisecond, -100 * time.Millisecond}
					ctx, cancel := context.WithCancel(context.Background())
					var wg sync.WaitGroup
					begin := time.Now()
					for i := range sc.replicas {
						skew := skews[i]
						name := fmt.Sprintf("r%d", i)
						r, err := runner.New(runner.Options{
							Claimer: led.claimer(name, open(name)), ClaimerName: kind, Instance: name,
							Lease: 5 * time.Second, MaxClockSkew: 500 * time.Millisecond, ShutdownGrace: 5 * time.Second,
							Now: func() time.Time { return time.Now().Add(skew) }, Observe: led.observer(name),
						}, jobs)
						if err != nil {
							t.Fatal(err)
						}
						wg.Go(func() { _ = r.Run(ctx) })
						time.Sleep(sc.startGap) // replicas come up at different moments
					}
					time.Sleep(sc.span)
					end := time.Now()
					cancel()
					wg.Wait()

					sched := mustSchedule(t, sc.spec)
					// From the moment every replica was up, with a skew's margin,
					// to a margin before shutdown.
					from := begin.Add(time.Duration(sc.replicas)*sc.startGap + time.Second)
					var ids []string
					var expected []claim.Run
					for at := sched.Next(from); at.Before(end.Add(-2 * time.Second)); at = sched.Next(at) {
						expected = append(expected, claim.Run{Job: "tick", At: at})
						id := claim.Run{Job: "tick", At: at}.ID()
						s := led.starts(id)
						if len(s) != 1 {
							t.Errorf("%s started %d times, want once", id, len(s))
							led.explain(t, id)
							continue
						}
						if f := led.finishes(id); len(f) != 1 || f[0].Status != claim.Succeeded {
							t.Errorf("%s finished %+v, want one success", id, f)
						}
						ids = append(ids, id)
					}
					n := len(ids)
					if min := int(sc.span/sched.Period(begin)) - 4; n < min {
						t.Fatalf("checked %d instants, want at least %d", n, min)
					}
					led.check(t, history.Spec{Forbid: map[string]bool{"tick": true}, Expected: expected})
					p50, worst := lags.worst(ids)
					t.Logf("%s %s: %d instants exactly once; lag from the true instant to handler start p50 %v, worst %v (replica clocks skewed by up to ±450ms)",
						kind, sc.spec, n, p50.Round(time.Millisecond), worst.Round(time.Millisecond))
				})
			})
		}
	}
}
