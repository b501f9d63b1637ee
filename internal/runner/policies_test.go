package runner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
	"github.com/scheduler-dev/scheduler/job"
)

// fleet is three replicas as goroutines, each on its own client of one
// real backend, sharing a ledger.
type fleet struct {
	t      *testing.T
	kind   string
	open   func(string) *claimers.Backend
	led    *ledger
	jobs   []runner.Job
	cancel []context.CancelFunc
	wg     sync.WaitGroup
}

func newFleet(t *testing.T, kind string, jobs []runner.Job) *fleet {
	return &fleet{t: t, kind: kind, led: newLedger(), jobs: jobs, open: backends.Open(t, kind)}
}

// start brings up replicas named names.
func (f *fleet) start(names ...string) {
	for _, name := range names {
		b := f.open(name)
		r, err := runner.New(runner.Options{
			Claimer: f.led.claimer(name, b.Claimer), ClaimerName: f.kind, Instance: name,
			Controls: control.New(b.Controls, nil), ControlEvery: 200 * time.Millisecond,
			Lease: 2 * time.Second, MaxClockSkew: 500 * time.Millisecond, ShutdownGrace: 3 * time.Second,
			Observe: f.led.observer(name),
		}, f.jobs)
		if err != nil {
			f.t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		f.cancel = append(f.cancel, cancel)
		f.wg.Go(func() { _ = r.Run(ctx) })
	}
}

// stop shuts every replica down and waits for them.
func (f *fleet) stop() {
	for _, c := range f.cancel {
		c()
	}
	f.cancel = nil
	f.wg.Wait()
}

// handled is one handler's run as the ledger saw it.
type handled struct {
	id          string
	at          time.Time
	replica     string
	start, stop time.Time
	status      claim.Status
}

// executions lists the handlers of job that ran, by start.
func (f *fleet) executions(job string) []handled {
	var out []handled
	returns := f.led.events(history.Return)
	for id, starts := range f.led.events(history.Start) {
		for _, s := range starts {
			if s.Run.Job != job {
				continue
			}
			x := handled{id: id, at: s.Run.At, replica: s.Replica, start: s.At}
			for _, r := range returns[id] {
				if r.Token == s.Token {
					x.stop, x.status = r.At, r.Status
				}
			}
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b handled) int { return a.start.Compare(b.start) })
	return out
}

// On every real backend, with three replicas as goroutines on their own
// clients, one fleet runs four jobs at once:
//   - buffer-one: one instant waits for the running one and starts as it
//     ends; an instant that finds one waiting is skipped; no two overlap;
//   - replace: each instant revokes the run before it, whichever replica
//     holds it, whose handler is cancelled with ErrLeaseLost and whose run
//     ends skipped (replaced); then it runs;
//   - retries: each instant of a job failing twice runs three attempts,
//     each after its backoff, under growing fences, and succeeds once;
//   - jitter: each run starts once, at its instant plus the offset every
//     replica hashes alike, never before it, under the instant's run id.
func TestRunSemanticsAcrossReplicasOnRealBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock test: 14s")
	}
	const backoff = 200 * time.Millisecond
	const jitter = 1500 * time.Millisecond
	testenv.WallClock(t)
	var all sync.WaitGroup
	defer all.Wait()
	for _, kind := range backends.Kinds {
		all.Go(func() {
			t.Run(kind, func(t *testing.T) {
				var mu sync.Mutex
				cancelled := map[string]error{}   // replace's handlers, by run id: the cause
				started := map[string]time.Time{} // spread's, by run id: the wall clock
				spread := mustSchedule(t, "@every 2s")
				jobs := []runner.Job{
					{Name: "flaky", Schedule: mustSchedule(t, "@every 3s"), Handler: failUntil(3), MaxAttempts: 3, Backoff: backoff},
					{Name: "spread", Schedule: spread, Jitter: jitter, Handler: func(ctx context.Context, run job.Run) error {
						mu.Lock()
						defer mu.Unlock()
						started[run.ID] = time.Now()
						return nil
					}},
					{Name: "buffer", Schedule: mustSchedule(t, "@every 1s"), Overlap: runner.OverlapBufferOne,
						Handler: func(ctx context.Context, run job.Run) error {
							select {
							case <-time.After(2500 * time.Millisecond):
							case <-ctx.Done():
							}
							return nil
						}},
					{Name: "replace", Schedule: mustSchedule(t, "@every 3s"), Overlap: runner.OverlapReplace,
						Handler: func(ctx context.Context, run job.Run) error {
							<-ctx.Done() // runs until replaced, or shut down
							mu.Lock()
							cancelled[run.ID] = context.Cause(ctx)
							mu.Unlock()
							return context.Cause(ctx)
						}},
				}
				f := newFleet(t, kind, jobs)
				f.start("r0", "r1", "r2")
				// Instants are checked from a second after every replica's
				// client was open: taken before, on a loaded machine, the
				// first flaky instant could pass before any replica ran
				// ("0 starts", one CI run).
				begin := time.Now()
				time.Sleep(14 * time.Second)
				end := time.Now()
				// The instants judged below end before the replicas stop: on
				// a loaded machine the last one's claims and attempts can
				// run past end (two seconds after it fell due, the last
				// flaky instant had not started: one CI run).
				flaky := mustSchedule(t, "@every 3s")
				var flakies, spreads []claim.Run
				for at := flaky.Next(begin.Add(time.Second)); at.Before(end.Add(-2 * time.Second)); at = flaky.Next(at) {
					flakies = append(flakies, claim.Run{Job: "flaky", At: at})
				}
				for at := spread.Next(begin.Add(time.Second)); at.Before(end.Add(-3 * time.Second)); at = spread.Next(at) {
					spreads = append(spreads, claim.Run{Job: "spread", At: at})
				}
				f.led.awaitEnded(t, slices.Concat(flakies, spreads), 30*time.Second)
				f.stop()
				var expected []claim.Run

				// retries: three attempts, each after its backoff, one success.
				// An instant that falls due while the one before it is still
				// retrying (a loaded machine stretches three claims, three
				// releases and the backoffs past 3s; one CI run) is skipped
				// for overlap, as the default policy says: that is checked
				// too, against when the run before it ended.
				retried := 0
				for _, run := range flakies {
					expected = append(expected, run)
					if len(f.led.starts(run.ID())) == 0 {
						checkOverlapSkip(t, f.led, run, claim.Run{Job: "flaky", At: run.At.Add(-3 * time.Second)})
						t.Logf("%s: skipped for overlap, the run before it still retrying", run.ID())
						continue
					}
					retried++
					checkAttempts(t, f.led, run.ID(), 3, backoff)
					ok := 0
					for _, x := range f.led.finishes(run.ID()) {
						if x.Status == claim.Succeeded {
							ok++
						}
					}
					if ok != 1 {
						t.Errorf("%s succeeded %d times, want once", run.ID(), ok)
					}
				}

				if retried == 0 {
					t.Errorf("flaky: no instant between %s and %s ran its attempts", begin.Format("15:04:05.000"), end.Format("15:04:05.000"))
				}

				// jitter: each start at its hashed offset, never before it.
				// Claims hold back up to Lease/10 for fairness, and a loaded
				// machine delays some starts more (1.5s beside a busy loop,
				// which also had an instant skipped for overlap behind a
				// late one): the typical start is judged, which an offset
				// applied twice would move by hundreds of milliseconds.
				var widest time.Duration
				var lags []time.Duration
				for _, run := range spreads {
					expected = append(expected, run)
					fire := spread.Jittered("spread", run.At, jitter)
					widest = max(widest, fire.Sub(run.At))
					switch n := len(f.led.starts(run.ID())); {
					case n == 0:
						checkOverlapSkip(t, f.led, run, claim.Run{Job: "spread", At: run.At.Add(-2 * time.Second)})
						continue
					case n > 1:
						t.Errorf("%s started %d times, want once", run.ID(), n)
						continue
					}
					mu.Lock()
					s := started[run.ID()]
					mu.Unlock()
					lag := s.Sub(fire)
					if lag < 0 {
						t.Errorf("%s started %v before its jittered start %v (offset %v)",
							run.ID(), -lag, fire.Format("15:04:05.000"), fire.Sub(run.At))
					}
					lags = append(lags, lag)
				}
				slices.Sort(lags)
				t.Logf("spread: start lags after the jittered starts: %v", lags)
				if len(lags) == 0 {
					t.Errorf("spread: no instant started")
				} else if median := lags[len(lags)/2]; median > 400*time.Millisecond {
					t.Errorf("spread: the median start was %v after its jittered start, want within 400ms (lags %v)", median, lags)
				}
				if widest < 300*time.Millisecond {
					t.Errorf("spread: the widest offset was %v: the jitter was not applied", widest)
				}

				// buffer-one: back to back, never overlapping, some skipped.
				xs := f.executions("buffer")
				if len(xs) < 3 {
					t.Fatalf("buffer ran %d times in 14s, want at least 3", len(xs))
				}
				for i := 1; i < len(xs); i++ {
					gap := xs[i].start.Sub(xs[i-1].stop)
					if gap < 0 {
						t.Errorf("buffer: %s started %v before %s returned", xs[i].id, -gap, xs[i-1].id)
					}
					if !xs[i].stop.IsZero() && gap > 1500*time.Millisecond {
						t.Errorf("buffer: %s started %v after %s returned, want it waiting and starting as it ended", xs[i].id, gap, xs[i-1].id)
					}
				}
				skipped := 0
				for id, reasons := range f.led.skipped() {
					if slices.Contains(reasons, runner.ReasonOverlap) && len(id) > 6 && id[:6] == "buffer" {
						skipped++
					}
				}
				if skipped < 3 {
					t.Errorf("buffer: %d instants skipped, want the ones that found a run waiting (about half)", skipped)
				}

				// replace: each run but the last was cancelled by the next.
				rs := f.executions("replace")
				if len(rs) < 3 {
					t.Fatalf("replace ran %d times in 14s, want at least 3", len(rs))
				}
				holders := map[string]bool{}
				for i, x := range rs[:len(rs)-1] {
					mu.Lock()
					cause := cancelled[x.id]
					mu.Unlock()
					if !errors.Is(cause, claim.ErrLeaseLost) {
						t.Errorf("replace: %s's handler ended with cause %v, want ErrLeaseLost (replaced)", x.id, cause)
					}
					if next := rs[i+1]; next.start.Before(x.stop) {
						t.Errorf("replace: %s started %v before %s stopped", next.id, x.stop.Sub(next.start), x.id)
					} else if lag := next.start.Sub(next.at); lag > 2500*time.Millisecond {
						t.Errorf("replace: %s started %v after its instant, want the run it replaces revoked within a control tick", next.id, lag)
					}
					reasons := f.led.skipped()[x.id]
					if !slices.Contains(reasons, runner.ReasonReplaced) {
						t.Errorf("replace: %s skipped for %v, want replaced", x.id, reasons)
					}
					holders[x.replica] = true
				}
				if len(holders) < 2 && len(rs) > 3 {
					t.Logf("replace: every replaced run was held by one replica (%v)", holders)
				}
				f.led.check(t, history.Spec{Forbid: map[string]bool{"buffer": true, "replace": true, "flaky": true, "spread": true}, Expected: expected})
			})
		})
	}
}

// Under misfire: run-all, on every real backend: after an outage of
// every replica, three replicas starting together run the newest
// max_catchup missed instants, oldest first, each once, one after the
// other, and record the older ones missed.
func TestCatchUpAcrossReplicasOnRealBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock test: 20s")
	}
	testenv.WallClock(t)
	var all sync.WaitGroup
	defer all.Wait()
	for _, kind := range backends.Kinds {
		all.Go(func() {
			t.Run(kind, func(t *testing.T) {
				sched := mustSchedule(t, "@every 2s")
				jobs := []runner.Job{{Name: "catchup", Schedule: sched, Misfire: runner.MisfireRunAll, MaxCatchup: 3,
					Handler: func(ctx context.Context, run job.Run) error {
						time.Sleep(300 * time.Millisecond)
						return nil
					}}}
				f := newFleet(t, kind, jobs)
				f.start("r0")
				time.Sleep(5 * time.Second)
				f.stop()
				down := time.Now()
				time.Sleep(11 * time.Second)
				up := time.Now()
				f.start("r0", "r1", "r2")
				time.Sleep(5 * time.Second)
				f.stop()

				var missedAt []time.Time // instants while every replica was down
				for at := sched.Next(down); at.Before(up); at = sched.Next(at) {
					missedAt = append(missedAt, at)
				}
				if len(missedAt) < 5 {
					t.Fatalf("%d instants fell in the outage, want at least 5", len(missedAt))
				}
				caught := missedAt[len(missedAt)-3:]
				var order []time.Time
				for _, x := range f.executions("catchup") {
					if !x.at.Before(up) {
						continue
					}
					if x.start.Before(up) {
						continue // ran before the outage
					}
					order = append(order, x.at)
				}
				// Each replica counts the newest three from its own start: one
				// that starts a second later may already see the first of them
				// as older, and record it missed before the others run it. So
				// the run ones are a tail of the newest three, at least two,
				// oldest first, each once; every other outage instant is
				// recorded missed, once, and never runs.
				if len(order) < 2 || len(order) > 3 || fmt.Sprint(order) != fmt.Sprint(caught[3-len(order):]) {
					t.Errorf("caught up %v, want the newest 3 missed (or the newest 2 of them), oldest first, each once: %v", order, caught)
				}
				skips := f.led.skipped()
				for _, at := range missedAt[:len(missedAt)-len(order)] {
					id := claim.Run{Job: "catchup", At: at}.ID()
					if n := len(f.led.starts(id)); n != 0 {
						t.Errorf("%s, older than the ones caught up, ran %d times", id, n)
					}
					if n := slices.Index(skips[id], runner.ReasonMissed); n < 0 || slices.Contains(skips[id][n+1:], runner.ReasonMissed) {
						t.Errorf("%s: skipped %v, want recorded missed once", id, skips[id])
					}
				}
				f.led.check(t, history.Spec{Forbid: map[string]bool{"catchup": true}})
			})
		})
	}
}
