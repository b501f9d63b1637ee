package runner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ledger records what every replica reported in one history.Log, the
// ledger internal/explore and `scheduler compare` judge histories by, and
// keeps the claim each run was granted under so tests can read its holder,
// attempt and fence. Replicas observe through observer; claimers that go
// through claimer also log their grants, renewals and releases, which
// history.Check needs for its lease invariants (grant-overlap, fence-order,
// released-twice, abandoned).
type ledger struct {
	log    *history.Log
	mu     sync.Mutex
	claims map[string]*claim.Claim // by token
}

func newLedger() *ledger {
	return &ledger{log: history.NewLog(nil), claims: map[string]*claim.Claim{}}
}

// observer returns replica's Observe hook.
func (l *ledger) observer(replica string) func(runner.Event) {
	logged := l.log.Observer(replica, nil)
	return func(e runner.Event) {
		if e.Claim != nil {
			l.mu.Lock()
			if _, ok := l.claims[e.Claim.Token]; !ok {
				l.claims[e.Claim.Token] = e.Claim
			}
			l.mu.Unlock()
		}
		logged(e)
	}
}

// claimer wraps replica's claimer so that its accepted calls are logged.
func (l *ledger) claimer(replica string, c claim.Claimer) claim.Claimer {
	return &loggedClaimer{Claimer: c, log: l.log, replica: replica}
}

// loggedClaimer logs the grants, renewals and releases a replica's claimer
// accepts into a history.Log.
type loggedClaimer struct {
	claim.Claimer
	log     *history.Log
	replica string
}

func (c *loggedClaimer) Claim(ctx context.Context, runs []claim.Run, l time.Duration) ([]*claim.Claim, []error) {
	sent := time.Now()
	cls, errs := c.Claimer.Claim(ctx, runs, l)
	c.log.Claimed(c.replica, sent, runs, l, cls, errs)
	return cls, errs
}

func (c *loggedClaimer) Renew(ctx context.Context, cl *claim.Claim, l time.Duration) error {
	err := c.Claimer.Renew(ctx, cl, l)
	if err == nil {
		c.log.Renewed(c.replica, cl)
	}
	return err
}

func (c *loggedClaimer) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	sent := time.Now()
	errs := c.Claimer.Release(ctx, cls, outs)
	c.log.Released(c.replica, sent, cls, outs, errs)
	return errs
}

// events returns the logged events of kind, by run id.
func (l *ledger) events(kind history.Kind) map[string][]history.Event {
	by := map[string][]history.Event{}
	for _, e := range l.log.Events() {
		if e.Kind == kind {
			by[e.Run.ID()] = append(by[e.Run.ID()], e)
		}
	}
	return by
}

func (l *ledger) claimOf(token string) *claim.Claim {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.claims[token]
}

// started returns the claims each run was started under, by run id.
func (l *ledger) started() map[string][]*claim.Claim {
	by := map[string][]*claim.Claim{}
	for id, evs := range l.events(history.Start) {
		for _, e := range evs {
			by[id] = append(by[id], l.claimOf(e.Token))
		}
	}
	return by
}

// starts returns the claims run id was started under, in order.
func (l *ledger) starts(id string) []*claim.Claim {
	return l.started()[id]
}

// finishes returns how run id finished on each replica that held it, in order.
func (l *ledger) finishes(id string) []runner.Event {
	var out []runner.Event
	for _, e := range l.events(history.End)[id] {
		f := runner.Event{Kind: runner.EventFinished, Run: e.Run, Claim: l.claimOf(e.Token), Status: e.Status, Ran: e.Ran}
		if e.Note != "" {
			f.Err = errors.New(e.Note)
		}
		out = append(out, f)
	}
	return out
}

// awaitEnded waits until each of runs has ended (a terminal release
// confirmed) on some replica, and fails t if one has not within d.
func (l *ledger) awaitEnded(t *testing.T, runs []claim.Run, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, run := range runs {
		for !l.ended(run.ID()) {
			if time.Now().After(deadline) {
				t.Errorf("%s had not ended %v after the replicas were let run", run.ID(), d)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// ended reports whether run id's terminal release was confirmed: the
// backend accepted it, or its replica's run ended so.
func (l *ledger) ended(id string) bool {
	for _, e := range l.log.Events() {
		if (e.Kind == history.End || e.Kind == history.Release) && e.Status.Terminal() && e.Run.ID() == id {
			return true
		}
	}
	return false
}

// missedLate reports whether run id was recorded missed, and only
// granted (to anyone) after deadline.
func (l *ledger) missedLate(id string, deadline time.Time) bool {
	missed := false
	for _, e := range l.log.Events() {
		switch {
		case e.Run.ID() != id:
		case e.Kind == history.Skip && e.Reason == runner.ReasonMissed:
			missed = true
		case e.Kind == history.Grant && !e.At.After(deadline):
			return false
		}
	}
	return missed
}

// explain logs every event of run id, for a failure's message.
func (l *ledger) explain(t *testing.T, id string) {
	t.Helper()
	for _, e := range l.log.Events() {
		if e.Run.ID() == id {
			t.Logf("  %s %v", e.At.Format("15:04:05.000"), e)
		}
	}
}

// skipped returns the reasons runs were skipped for, by run id.
func (l *ledger) skipped() map[string][]string {
	by := map[string][]string{}
	for id, evs := range l.events(history.Skip) {
		for _, e := range evs {
			by[id] = append(by[id], e.Reason)
		}
	}
	return by
}

// check judges the history with history.Check and fails t on every
// violation: no run succeeds twice or runs on two replicas at once, and,
// for what went through claimer, no run is granted while its previous
// holder may trust its lease, fences grow, no run is released terminal
// twice, nor handed back once its handler did the work.
func (l *ledger) check(t *testing.T, spec history.Spec) {
	t.Helper()
	evs := l.log.Events()
	if len(evs) == 0 {
		t.Fatal("history: nothing was logged")
	}
	for _, v := range history.Check(evs, spec) {
		t.Errorf("history: %s", v.Format(evs[0].At))
	}
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
	name  string
	skew  time.Duration
	jump  *atomic.Int64 // ns the replica's clock is ahead beyond skew, when set: a clock that jumps
	store *memory.Store
	jobs  []runner.Job
	lease time.Duration
	grace time.Duration
	led   *ledger
	wrap  func(claim.Claimer) claim.Claimer
	sweep time.Duration // Options.SweepEvery, when set
	// metrics, when set, receives the replica's metrics; the replica
	// always honours the store's controls.
	metrics *runner.Metrics
	cancel  context.CancelFunc
	done    chan struct{}
	r       *runner.Runner
}

func (rp *replica) start(t *testing.T) {
	t.Helper()
	var c claim.Claimer = memory.New(rp.store, rp.name)
	if rp.wrap != nil {
		c = rp.wrap(c)
	}
	c = rp.led.claimer(rp.name, c)
	skew, jump := rp.skew, rp.jump
	r, err := runner.New(runner.Options{
		Claimer: c, ClaimerName: "memory", Instance: rp.name,
		Lease: cmpOr(rp.lease, 3*time.Second), MaxClockSkew: time.Second, ShutdownGrace: rp.grace, SweepEvery: rp.sweep,
		Now: func() time.Time {
			if jump != nil {
				return time.Now().Add(skew + time.Duration(jump.Load()))
			}
			return time.Now().Add(skew)
		},
		Observe:  rp.led.observer(rp.name),
		Metrics:  rp.metrics,
		Controls: control.New(rp.store.Controls(), nil),
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
				var expected []claim.Run
				for at := sched.Next(first); at.Before(last); at = sched.Next(at) {
					expected = append(expected, claim.Run{Job: "tick", At: at})
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
				led.check(t, history.Spec{Forbid: map[string]bool{"tick": true}, Expected: expected})
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
		led.check(t, history.Spec{Expected: []claim.Run{{Job: "billing", At: at}}})
	})
}

// slowLink puts oneWay of latency on each side of every call, as a far
// backend does, and dates the claims it returns from when their request
// left, as a real claimer does (the lease began no earlier).
type slowLink struct {
	claim.Claimer
	oneWay time.Duration
}

func (s *slowLink) trip(ctx context.Context) error {
	select {
	case <-time.After(s.oneWay):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (s *slowLink) Claim(ctx context.Context, runs []claim.Run, l time.Duration) ([]*claim.Claim, []error) {
	sent := time.Now()
	fail := func(err error) ([]*claim.Claim, []error) {
		return make([]*claim.Claim, len(runs)), slices.Repeat([]error{err}, len(runs))
	}
	if err := s.trip(ctx); err != nil {
		return fail(err)
	}
	cls, errs := s.Claimer.Claim(ctx, runs, l)
	for _, cl := range cls {
		if cl != nil {
			cl.Requested = sent
		}
	}
	if err := s.trip(ctx); err != nil {
		return fail(err) // the reply is lost; the grants stay until their leases end
	}
	return cls, errs
}

func (s *slowLink) Renew(ctx context.Context, c *claim.Claim, l time.Duration) error {
	sent := time.Now()
	if err := s.trip(ctx); err != nil {
		return err
	}
	renewed := *c
	if err := s.Claimer.Renew(ctx, &renewed, l); err != nil {
		return err
	}
	renewed.Requested = sent
	if err := s.trip(ctx); err != nil {
		return err // the holder never hears of it
	}
	// Only the lease fields, as a real claimer: the rest is read
	// concurrently (Renew's contract).
	c.Deadline, c.Requested, c.Lease = renewed.Deadline, renewed.Requested, renewed.Lease
	return nil
}

func (s *slowLink) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	if err := s.trip(ctx); err != nil {
		return slices.Repeat([]error{err}, len(cls))
	}
	errs := s.Claimer.Release(ctx, cls, outs)
	if err := s.trip(ctx); err != nil {
		return slices.Repeat([]error{err}, len(cls))
	}
	return errs
}

// A backend 900ms away (just under the claim timeout, a third of the
// lease) still keeps a long run's lease: renewals are timed from when the
// lease's last request left, not from when its reply came back, so each
// has the round trip's room before the trust window closes.
func TestRenewalsKeepALeaseOverASlowLink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		causes := make(chan error, 4)
		const work = 2500 * time.Millisecond // past the claim's own trust window
		jobs := []runner.Job{{Name: "far", Schedule: mustSchedule(t, "@every 1h"),
			Handler: func(ctx context.Context, run job.Run) error {
				select {
				case <-time.After(work):
					causes <- nil
					return nil
				case <-ctx.Done():
					causes <- context.Cause(ctx)
					return ctx.Err()
				}
			}}}
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour - 2*time.Second)))
		a := &replica{name: "a", store: memory.NewStore(nil), jobs: jobs, led: led, lease: 3 * time.Second,
			wrap: func(c claim.Claimer) claim.Claimer { return &slowLink{Claimer: c, oneWay: 450 * time.Millisecond} }}
		a.start(t)
		if cause := <-causes; cause != nil {
			t.Errorf("the handler was cancelled: %v", cause)
		}
		synctest.Wait()
		a.stop()
		run := claim.Run{Job: "far", At: time.Now().Truncate(time.Hour)}
		if f := led.finishes(run.ID()); len(f) != 1 || f[0].Status != claim.Succeeded {
			t.Fatalf("finishes = %+v, want one success", f)
		}
		led.check(t, history.Spec{Expected: []claim.Run{run}})
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
		run := claim.Run{Job: "long", At: time.Now().Truncate(time.Hour)}
		id := run.ID()
		f := led.finishes(id)
		if len(f) != 2 || f[0].Status != claim.Interrupted || f[1].Status != claim.Succeeded || f[1].Claim.Attempt != 2 {
			t.Fatalf("finishes = %+v, want interrupted on a then success on b at attempt 2", f)
		}
		led.check(t, history.Spec{Expected: []claim.Run{run}})
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
		run := claim.Run{Job: "short", At: time.Now().Truncate(10 * time.Second)}
		if f := led.finishes(run.ID()); len(f) != 1 || f[0].Status != claim.Succeeded {
			t.Fatalf("finishes = %+v, want success within the grace", f)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"short": true}, Expected: []claim.Run{run}})
	})
}

func TestOverlapForbidSkipsWhileThePreviousRunLives(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		var overlaps atomic.Int32
		jobs := []runner.Job{{Name: "slow", Schedule: mustSchedule(t, "* * * * * *"),
			Handler: countOverlaps(&overlaps, 2500*time.Millisecond)}}
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
		var overlapSkips int
		for _, reasons := range led.skipped() {
			for _, r := range reasons {
				if r == runner.ReasonOverlap {
					overlapSkips++
				}
			}
		}
		if started := len(led.started()); started < 5 || overlapSkips < 10 {
			t.Fatalf("%d runs started, %d overlap skips; want runs every ~3s and the instants between skipped", started, overlapSkips)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"slow": true}})
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
					wantStatus = claim.Missed
				}
				if recs[0].Status != wantStatus {
					t.Fatalf("recorded status %s, want %s", recs[0].Status, wantStatus)
				}
				led.check(t, history.Spec{Forbid: map[string]bool{"nightly": true},
					Expected: []claim.Run{{Job: "nightly", At: day.Add(2 * time.Hour)}}})
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
		run := claim.Run{Job: "stuck", At: time.Now().Truncate(time.Minute)}
		if f := led.finishes(run.ID()); len(f) != 1 || f[0].Status != claim.Timeout {
			t.Fatalf("finishes = %+v, want timeout", f)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"stuck": true}, Expected: []claim.Run{run}})
	})
}

// TestLedgerCatchesARunExecutedTwice: the ledger, and the fault table's
// record, judge what replicas report by history.Check: two replicas that
// both execute one run, at once, and both report it succeeded, break
// run-overlap and succeeded-twice.
func TestLedgerCatchesARunExecutedTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newLedger()
		s := &faultRun{events: map[string][]seenEvent{}, log: history.NewLog(nil)}
		run := claim.Run{Job: "tick", At: time.Now().Truncate(time.Second)}
		ca := &claim.Claim{Run: run, Holder: "a", Token: "token-a", Fence: 1, Attempt: 1}
		cb := &claim.Claim{Run: run, Holder: "b", Token: "token-b", Fence: 2, Attempt: 2}
		obs := map[string][]func(runner.Event){"a": {led.observer("a"), s.observe("a")}, "b": {led.observer("b"), s.observe("b")}}
		for _, step := range []struct {
			replica string
			e       runner.Event
		}{
			{"a", runner.Event{Kind: runner.EventStarted, Run: run, Claim: ca}},
			{"b", runner.Event{Kind: runner.EventStarted, Run: run, Claim: cb}},
			{"a", runner.Event{Kind: runner.EventReturned, Run: run, Claim: ca, Ran: 2 * time.Second}},
			{"a", runner.Event{Kind: runner.EventFinished, Run: run, Claim: ca, Status: claim.Succeeded, Ran: 2 * time.Second}},
			{"b", runner.Event{Kind: runner.EventReturned, Run: run, Claim: cb, Ran: 2 * time.Second}},
			{"b", runner.Event{Kind: runner.EventFinished, Run: run, Claim: cb, Status: claim.Succeeded, Ran: 2 * time.Second}},
		} {
			for _, o := range obs[step.replica] {
				o(step.e)
			}
			time.Sleep(time.Second)
		}
		if st := led.starts(run.ID()); len(st) != 2 || st[0] != ca || st[1] != cb {
			t.Fatalf("starts = %+v, want a's claim then b's", st)
		}
		if f := led.finishes(run.ID()); len(f) != 2 || f[0].Claim != ca || f[1].Claim != cb || f[1].Status != claim.Succeeded {
			t.Fatalf("finishes = %+v, want a's then b's success", f)
		}
		for name, l := range map[string]*history.Log{"ledger": led.log, "fault record": s.log} {
			var got []string
			for _, v := range history.Check(l.Events(), history.Spec{}) {
				got = append(got, v.Invariant)
			}
			if want := []string{history.RunOverlap, history.SucceededTwice}; !slices.Equal(got, want) {
				t.Errorf("%s: violations %v, want %v", name, got, want)
			}
		}
	})
}

// A late run its misfire policy does run (run-once's look-back, started
// long past its deadline) looks, to another replica's probe, like a claim
// held only to record a missed instant (a first attempt granted past its
// deadline); the probe asks again for a moment, but once the run is
// still live it yields to it: the next instant, due while it runs, is
// skipped (forbid), never started beside it.
func TestALateRunTheMisfirePolicyRunsIsStillYieldedTo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		var overlaps atomic.Int32
		jobs := []runner.Job{{Name: "hourly", Schedule: mustSchedule(t, "0 * * * *"), Misfire: runner.MisfireRunOnce, Grace: time.Hour,
			Handler: countOverlaps(&overlaps, 50*time.Minute)}} // past the next instant
		hour := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(hour.Add(20 * time.Minute))) // the look-back instant is 20 minutes late
		a := &replica{name: "a", store: store, jobs: jobs, led: led, grace: time.Hour}
		b := &replica{name: "b", store: store, jobs: jobs, led: led, grace: time.Hour}
		a.start(t)
		b.start(t)
		time.Sleep(45 * time.Minute)
		a.stop()
		b.stop()
		if overlaps.Load() != 0 {
			t.Fatalf("%d executions overlapped", overlaps.Load())
		}
		sts := statuses(t, store, "hourly")
		if sts[hour] != claim.Succeeded || sts[hour.Add(time.Hour)] != claim.Skipped {
			t.Fatalf("statuses %v: want %s succeeded (late, run-once) and %s skipped while it ran",
				sts, hour.Format(time.TimeOnly), hour.Add(time.Hour).Format(time.TimeOnly))
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"hourly": true}})
	})
}

// countOverlaps is a handler that runs for d, counting in overlaps every
// execution that started while another of its job was still running.
func countOverlaps(overlaps *atomic.Int32, d time.Duration) job.Handler {
	var running atomic.Int32
	return func(ctx context.Context, run job.Run) error {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer running.Add(-1)
		time.Sleep(d)
		return nil
	}
}

// slowRelease is a claimer whose releases land late: a loaded backend's
// commit, a reply retried.
type slowRelease struct {
	claim.Claimer
	delay time.Duration
}

func (s *slowRelease) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	time.Sleep(s.delay)
	return s.Claimer.Release(ctx, cls, outs)
}

// A replica whose clock runs ahead reaches an instant early. An earlier
// run still releasing then (its release slow, though done well before the
// instant) is no overlap: the instant has not come on the backend's clock,
// and by then nothing keeps it out. Skipped for overlap, it was lost.
func TestAnInstantReachedEarlyIsNotSkippedForARunThatEndsBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		jobs := []runner.Job{{Name: "tick", Schedule: mustSchedule(t, "* * * * * *"),
			Handler: func(ctx context.Context, run job.Run) error {
				time.Sleep(200 * time.Millisecond)
				return nil
			}}}
		slow := func(c claim.Claimer) claim.Claimer { return &slowRelease{Claimer: c, delay: 500 * time.Millisecond} }
		var reps []*replica
		for i, sk := range []time.Duration{0, 700 * time.Millisecond} {
			rp := &replica{name: fmt.Sprintf("r%d", i), skew: sk, store: store, jobs: jobs, led: led, wrap: slow}
			rp.start(t)
			reps = append(reps, rp)
		}
		first := time.Now().Add(2 * time.Second)
		time.Sleep(20 * time.Second)
		last := time.Now().Add(-3 * time.Second)
		for _, rp := range reps {
			rp.stop()
		}
		sched := mustSchedule(t, "* * * * * *")
		var expected []claim.Run
		for at := sched.Next(first); at.Before(last); at = sched.Next(at) {
			expected = append(expected, claim.Run{Job: "tick", At: at})
			id := claim.Run{Job: "tick", At: at}.ID()
			if s := led.starts(id); len(s) != 1 {
				led.explain(t, id)
				t.Fatalf("run %s started %d times, want once", id, len(s))
			}
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"tick": true}, Expected: expected})
	})
}
