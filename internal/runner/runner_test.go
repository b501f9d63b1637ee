package runner_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ledger records what every replica reported, keyed by run id.
type ledger struct {
	mu       sync.Mutex
	started  map[string][]*claim.Claim
	finished map[string][]runner.Event
	skipped  map[string][]string
}

func newLedger() *ledger {
	return &ledger{started: map[string][]*claim.Claim{}, finished: map[string][]runner.Event{}, skipped: map[string][]string{}}
}

func (l *ledger) observe(e runner.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch e.Kind {
	case runner.EventStarted:
		l.started[e.Run.ID()] = append(l.started[e.Run.ID()], e.Claim)
	case runner.EventFinished:
		l.finished[e.Run.ID()] = append(l.finished[e.Run.ID()], e)
	case runner.EventSkipped:
		l.skipped[e.Run.ID()] = append(l.skipped[e.Run.ID()], e.Reason)
	}
}

func (l *ledger) starts(id string) []*claim.Claim {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*claim.Claim(nil), l.started[id]...)
}

func (l *ledger) finishes(id string) []runner.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]runner.Event(nil), l.finished[id]...)
}

func mustSchedule(t *testing.T, spec string) *schedule.Schedule {
	t.Helper()
	s, err := schedule.Parse(spec, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type replica struct {
	name   string
	skew   time.Duration
	store  *memory.Store
	jobs   []runner.Job
	lease  time.Duration
	grace  time.Duration
	led    *ledger
	wrap   func(claim.Claimer) claim.Claimer
	cancel context.CancelFunc
	done   chan struct{}
	r      *runner.Runner
}

func (rp *replica) start(t *testing.T) {
	t.Helper()
	var c claim.Claimer = memory.New(rp.store, rp.name)
	if rp.wrap != nil {
		c = rp.wrap(c)
	}
	skew := rp.skew
	r, err := runner.New(runner.Options{
		Claimer: c, ClaimerName: "memory", Instance: rp.name,
		Lease: cmpOr(rp.lease, 3*time.Second), MaxClockSkew: time.Second, ShutdownGrace: rp.grace,
		Now:     func() time.Time { return time.Now().Add(skew) },
		Observe: rp.led.observe,
	}, rp.jobs)
	if err != nil {
		t.Fatal(err)
	}
	rp.r = r
	ctx, cancel := context.WithCancel(context.Background())
	rp.cancel, rp.done = cancel, make(chan struct{})
	go func() { defer close(rp.done); _ = r.Run(ctx) }()
}

func (rp *replica) stop() { rp.cancel(); <-rp.done }

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// The instant of every test run starts at a whole second of the fake clock.
func TestEveryInstantRunsExactlyOnceAcrossSkewedReplicas(t *testing.T) {
	for _, spec := range []string{"* * * * * *", "@every 3s"} {
		t.Run(spec, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore(nil)
				led := newLedger()
				var running, overlaps atomic.Int32
				jobs := []runner.Job{{Name: "tick", Schedule: mustSchedule(t, spec),
					Handler: func(ctx context.Context, run job.Run) error {
						if running.Add(1) > 1 {
							overlaps.Add(1)
						}
						defer running.Add(-1)
						time.Sleep(200 * time.Millisecond)
						return nil
					}}}
				// Skews within max_clock_skew (1s), replicas started apart.
				skews := []time.Duration{0, 700 * time.Millisecond, -900 * time.Millisecond, 300 * time.Millisecond}
				var reps []*replica
				for i, sk := range skews {
					rp := &replica{name: fmt.Sprintf("r%d", i), skew: sk, store: store, jobs: jobs, led: led}
					rp.start(t)
					reps = append(reps, rp)
					time.Sleep(1300 * time.Millisecond)
				}
				first := time.Now()
				time.Sleep(40 * time.Second)
				last := time.Now().Add(-5 * time.Second)
				for _, rp := range reps {
					rp.stop()
				}
				sched := mustSchedule(t, spec)
				n := 0
				for at := sched.Next(first); at.Before(last); at = sched.Next(at) {
					id := claim.Run{Job: "tick", At: at}.ID()
					if s := led.starts(id); len(s) != 1 {
						t.Fatalf("run %s started %d times, want once", id, len(s))
					}
					if f := led.finishes(id); len(f) != 1 || f[0].Status != claim.Succeeded {
						t.Fatalf("run %s finished %+v, want one success", id, f)
					}
					n++
				}
				if n < 10 {
					t.Fatalf("checked only %d instants", n)
				}
				if overlaps.Load() != 0 {
					t.Fatalf("%d overlapping executions with overlap forbidden", overlaps.Load())
				}
			})
		})
	}
}

// failing is a claimer whose backend goes away when down is set: every call
// fails as unavailable, as for a replica cut off or frozen.
type failing struct {
	claim.Claimer
	down atomic.Bool
	only string // when set, only this job's calls fail
}

func (f *failing) fails(job string) bool { return f.down.Load() && (f.only == "" || f.only == job) }

func (f *failing) Claim(ctx context.Context, runs []claim.Run, l time.Duration) ([]*claim.Claim, []error) {
	return claim.EachRun(runs, func(r claim.Run) (*claim.Claim, error) {
		if f.fails(r.Job) {
			return nil, claim.ErrUnavailable
		}
		return claim.ClaimOne(ctx, f.Claimer, r, l)
	})
}

func (f *failing) Renew(ctx context.Context, c *claim.Claim, l time.Duration) error {
	if f.fails(c.Run.Job) {
		return claim.ErrUnavailable
	}
	return f.Claimer.Renew(ctx, c, l)
}

func (f *failing) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	return claim.EachClaim(cls, outs, func(c *claim.Claim, o claim.Status) error {
		if f.fails(c.Run.Job) {
			return claim.ErrUnavailable
		}
		return claim.ReleaseOne(ctx, f.Claimer, c, o)
	})
}

func TestHolderCutOffLosesLeaseAndStandbyTakesOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		causes := make(chan error, 4)
		var fa *failing
		gate := make(chan struct{})
		began := make(chan struct{})
		jobs := []runner.Job{{Name: "billing", Schedule: mustSchedule(t, "@every 1h"), Overlap: runner.OverlapAllow,
			Handler: func(ctx context.Context, run job.Run) error {
				if run.Attempt == 1 {
					fa.down.Store(true) // the holder is cut off from the backend mid-run
					close(began)
					<-ctx.Done()
					causes <- context.Cause(ctx)
					return ctx.Err()
				}
				close(gate)
				return nil
			}}}
		// Start just before an instant so both replicas contend for it.
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour - 2*time.Second)))
		a := &replica{name: "a", store: store, jobs: jobs, led: led, wrap: func(c claim.Claimer) claim.Claimer {
			fa = &failing{Claimer: c}
			return fa
		}}
		a.start(t)
		<-began // b comes up while a holds the run, and stands by
		b := &replica{name: "b", store: store, jobs: jobs, led: led}
		b.start(t)
		<-gate
		cause := <-causes
		if !errors.Is(cause, job.ErrLeaseLost) {
			t.Fatalf("cut-off holder's handler cause = %v, want ErrLeaseLost", cause)
		}
		synctest.Wait()
		a.stop()
		b.stop()
		at := time.Now().Truncate(time.Hour)
		id := claim.Run{Job: "billing", At: at}.ID()
		s := led.starts(id)
		if len(s) != 2 || s[0].Holder != "a" || s[1].Holder != "b" || s[1].Attempt != 2 || s[1].Fence <= s[0].Fence {
			t.Fatalf("starts = %+v, want a then b with attempt 2 and a higher fence", s)
		}
		statuses := map[string]claim.Status{}
		for _, f := range led.finishes(id) {
			statuses[f.Claim.Holder] = f.Status
		}
		if statuses["a"] != claim.LeaseLost || statuses["b"] != claim.Succeeded {
			t.Fatalf("statuses = %v, want a lease_lost, b succeeded", statuses)
		}
	})
}

func TestShutdownReleasesRunAsInterruptedForImmediateTakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		began := make(chan string, 4)
		jobs := []runner.Job{{Name: "long", Schedule: mustSchedule(t, "@every 1h"), Overlap: runner.OverlapAllow,
			Handler: func(ctx context.Context, run job.Run) error {
				began <- run.Instance
				if run.Instance == "a" {
					<-ctx.Done() // ignores nothing: stops when told
					return context.Cause(ctx)
				}
				return nil
			}}}
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour - 2*time.Second)))
		lease := time.Minute
		a := &replica{name: "a", store: store, jobs: jobs, led: led, lease: lease, grace: 5 * time.Second}
		a.start(t)
		if who := <-began; who != "a" {
			t.Fatalf("first holder %s, want a", who)
		}
		// b comes up while a holds the run, and stands by.
		b := &replica{name: "b", store: store, jobs: jobs, led: led, lease: lease}
		b.start(t)
		synctest.Wait()
		stopAt := time.Now()
		a.stop() // SIGTERM: grace passes, handler cancelled, released interrupted
		if who := <-began; who != "b" {
			t.Fatalf("second holder %s, want b", who)
		}
		// Taken over well before the one-minute lease would have expired.
		if took := time.Since(stopAt); took > 5*time.Second+lease/3+time.Second {
			t.Fatalf("takeover after %v; the interrupted release should not wait for the lease", took)
		}
		synctest.Wait()
		b.stop()
		id := claim.Run{Job: "long", At: time.Now().Truncate(time.Hour)}.ID()
		f := led.finishes(id)
		if len(f) != 2 || f[0].Status != claim.Interrupted || f[1].Status != claim.Succeeded || f[1].Claim.Attempt != 2 {
			t.Fatalf("finishes = %+v, want interrupted on a then success on b at attempt 2", f)
		}
	})
}

func TestShutdownLetsShortRunsFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		jobs := []runner.Job{{Name: "short", Schedule: mustSchedule(t, "@every 10s"),
			Handler: func(ctx context.Context, run job.Run) error {
				time.Sleep(2 * time.Second)
				return ctx.Err()
			}}}
		time.Sleep(time.Until(time.Now().Truncate(10 * time.Second).Add(9 * time.Second)))
		a := &replica{name: "a", store: memory.NewStore(nil), jobs: jobs, led: led, grace: 5 * time.Second}
		a.start(t)
		time.Sleep(1500 * time.Millisecond) // the run started half a second ago
		a.stop()
		id := claim.Run{Job: "short", At: time.Now().Truncate(10 * time.Second)}.ID()
		if f := led.finishes(id); len(f) != 1 || f[0].Status != claim.Succeeded {
			t.Fatalf("finishes = %+v, want success within the grace", f)
		}
	})
}

func TestOverlapForbidSkipsWhileThePreviousRunLives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		var running, overlaps atomic.Int32
		jobs := []runner.Job{{Name: "slow", Schedule: mustSchedule(t, "* * * * * *"),
			Handler: func(ctx context.Context, run job.Run) error {
				if running.Add(1) > 1 {
					overlaps.Add(1)
				}
				defer running.Add(-1)
				time.Sleep(2500 * time.Millisecond)
				return nil
			}}}
		a := &replica{name: "a", store: memory.NewStore(nil), jobs: jobs, led: led}
		b := &replica{name: "b", store: a.store, jobs: jobs, led: led}
		a.start(t)
		b.start(t)
		time.Sleep(20 * time.Second)
		a.stop()
		b.stop()
		if overlaps.Load() != 0 {
			t.Fatalf("%d overlapping executions", overlaps.Load())
		}
		led.mu.Lock()
		defer led.mu.Unlock()
		var overlapSkips int
		for _, reasons := range led.skipped {
			for _, r := range reasons {
				if r == runner.ReasonOverlap {
					overlapSkips++
				}
			}
		}
		if len(led.started) < 5 || overlapSkips < 10 {
			t.Fatalf("%d runs started, %d overlap skips; want runs every ~3s and the instants between skipped", len(led.started), overlapSkips)
		}
	})
}

func TestMisfireOnStartup(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   []claim.Status // statuses of the missed run across two replicas
	}{
		{runner.MisfireRunOnce, []claim.Status{claim.Succeeded}},
		{runner.MisfireSkip, nil},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore(nil)
				led := newLedger()
				jobs := []runner.Job{{Name: "nightly", Schedule: mustSchedule(t, "0 2 * * *"), Misfire: tc.policy, Grace: 6 * time.Hour,
					Handler: func(ctx context.Context, run job.Run) error { return nil }}}
				// Both replicas come up at 03:00, an hour after the missed instant.
				day := time.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)
				time.Sleep(time.Until(day.Add(3 * time.Hour)))
				a := &replica{name: "a", store: store, jobs: jobs, led: led}
				b := &replica{name: "b", store: store, jobs: jobs, led: led}
				a.start(t)
				b.start(t)
				time.Sleep(10 * time.Second)
				a.stop()
				b.stop()
				id := claim.Run{Job: "nightly", At: day.Add(2 * time.Hour)}.ID()
				var got []claim.Status
				for _, f := range led.finishes(id) {
					got = append(got, f.Status)
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("missed run finished %v, want %v", got, tc.want)
				}
				recs, err := memory.New(store, "x").History(context.Background(), "nightly", 5)
				if err != nil || len(recs) != 1 {
					t.Fatalf("history = %+v, %v; want the missed run recorded once", recs, err)
				}
				wantStatus := claim.Succeeded
				if tc.policy == runner.MisfireSkip {
					wantStatus = claim.Skipped
				}
				if recs[0].Status != wantStatus {
					t.Fatalf("recorded status %s, want %s", recs[0].Status, wantStatus)
				}
			})
		})
	}
}

func TestTimeoutCancelsTheHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		causes := make(chan error, 1)
		jobs := []runner.Job{{Name: "stuck", Schedule: mustSchedule(t, "@every 1m"), Timeout: 2 * time.Second,
			Handler: func(ctx context.Context, run job.Run) error {
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return ctx.Err()
			}}}
		time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(59 * time.Second)))
		a := &replica{name: "a", store: memory.NewStore(nil), jobs: jobs, led: led}
		a.start(t)
		if c := <-causes; !errors.Is(c, job.ErrTimeout) {
			t.Fatalf("cause %v, want ErrTimeout", c)
		}
		synctest.Wait()
		a.stop()
		id := claim.Run{Job: "stuck", At: time.Now().Truncate(time.Minute)}.ID()
		if f := led.finishes(id); len(f) != 1 || f[0].Status != claim.Timeout {
			t.Fatalf("finishes = %+v, want timeout", f)
		}
	})
}
