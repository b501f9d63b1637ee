package runner_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// TestForbidHoldsBehindManyRecordedSkips: a run of an overlap-forbidden
// job outlives dozens of its instants, each recorded as skipped. A
// replica that starts then remembers none of it; the backend's history,
// read deeper past the recorded skips, still tells it the old run owns
// the job.
func TestForbidHoldsBehindManyRecordedSkips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		var counted overlapping
		var first atomic.Bool
		jobs := []runner.Job{{Name: "marathon", Schedule: mustSchedule(t, "@every 1s"), Overlap: runner.OverlapForbid,
			Handler: counted.handler(func(job.Run) bool { return first.CompareAndSwap(false, true) }, 60*time.Second)}} // the marathon
		a := &replica{name: "a", store: store, jobs: jobs, led: led, lease: 3 * time.Second}
		b := &replica{name: "b", store: store, jobs: jobs, led: led, lease: 3 * time.Second}
		a.start(t)
		b.start(t)
		time.Sleep(45 * time.Second) // 40-odd instants skipped behind the marathon
		// c runs half a second ahead (within max_clock_skew): it claims each
		// instant first, so it is the one that must find the marathon.
		c := &replica{name: "c", skew: 500 * time.Millisecond, store: store, jobs: jobs, led: led, lease: 3 * time.Second}
		c.start(t)
		time.Sleep(10 * time.Second)
		for _, rp := range []*replica{a, b, c} {
			rp.stop()
		}
		if n := counted.overlaps.Load(); n != 0 {
			t.Errorf("%d runs of the forbidden job started while another executed", n)
		}
		if !first.Load() {
			t.Fatal("the marathon never ran")
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"marathon": true}})
	})
}

// overlapping counts the handlers of a job that started while another
// of them ran.
type overlapping struct{ running, overlaps atomic.Int32 }

// handler runs for longFor where long says so, else for 100ms, or until
// cancelled.
func (o *overlapping) handler(long func(job.Run) bool, longFor time.Duration) job.Handler {
	return func(ctx context.Context, run job.Run) error {
		if o.running.Add(1) > 1 {
			o.overlaps.Add(1)
		}
		defer o.running.Add(-1)
		d := 100 * time.Millisecond
		if long(run) {
			d = longFor
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		return nil
	}
}

// failWhile passes claims on, but answers each claim of run made while
// armed with an error, as connections the server dropped would
// (PostgreSQL's pg_terminate_backend: SQLSTATE 57P01).
type failWhile struct {
	claim.Claimer
	run   claim.Run
	armed atomic.Bool
	spent atomic.Bool // one was answered so
}

func (c *failWhile) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	for i, r := range runs {
		if r.ID() == c.run.ID() && c.armed.Load() {
			c.spent.Store(true)
			cls, errs := c.Claimer.Claim(ctx, slices.Delete(slices.Clone(runs), i, i+1), lease)
			cls = slices.Insert(cls, i, nil)
			errs = slices.Insert(errs, i, error(fmt.Errorf("connection terminated: %w", claim.ErrUnavailable)))
			return cls, errs
		}
	}
	return c.Claimer.Claim(ctx, runs, lease)
}

// An instant of a forbid job whose earlier run has just ended is not
// skipped for an overlap because of what the probe of that earlier run
// met for a moment (found by an outside review: such instants were
// recorded skipped with nothing live, and never ran):
//   - dropped connections (PostgreSQL's pg_terminate_backend): the probe
//     asks again until the backend answers, hears done;
//   - a claim held a moment only to record the run missed (replicas
//     starting together after an outage; a Redis restart's lost record):
//     the probe asks again a few times before it calls the run live.
func TestAProbeAsksAgainBeforeItSkipsForAnEarlierRunThatJustEnded(t *testing.T) {
	for _, tc := range []struct {
		name string
		// end ends the earlier run, a, held by other, around b.
		end func(t *testing.T, ctx context.Context, other claim.Claimer, cl *claim.Claim, fc *failWhile, b time.Time)
	}{
		{name: "connections dropped", end: func(t *testing.T, ctx context.Context, other claim.Claimer, cl *claim.Claim, fc *failWhile, b time.Time) {
			time.Sleep(time.Until(b.Add(-50 * time.Millisecond)))
			fc.armed.Store(true)
			release(t, ctx, other, cl, claim.Succeeded)
			time.Sleep(100 * time.Millisecond) // the connections are back
			fc.armed.Store(false)
			if !fc.spent.Load() {
				t.Fatal("the probe of the earlier run never met the dropped connection: the test shows nothing")
			}
		}},
		{name: "held a moment to record it missed", end: func(t *testing.T, ctx context.Context, other claim.Claimer, cl *claim.Claim, fc *failWhile, b time.Time) {
			time.Sleep(time.Until(b.Add(150 * time.Millisecond)))
			release(t, ctx, other, cl, claim.Missed)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				store := memory.NewStore(nil)
				start := time.Now().Truncate(10 * time.Second).Add(10 * time.Second)
				a, b := start.Add(10*time.Second), start.Add(20*time.Second)
				time.Sleep(time.Until(start))
				fc := &failWhile{Claimer: memory.New(store, "r1"), run: claim.Run{Job: "tick", At: a}}
				ran := make(chan time.Time, 10)
				r, err := runner.New(runner.Options{Claimer: fc, Instance: "r1", Lease: 6 * time.Second},
					[]runner.Job{{Name: "tick", Schedule: mustSchedule(t, "*/10 * * * * *"), Overlap: runner.OverlapForbid,
						Handler: func(ctx context.Context, run job.Run) error {
							if run.ScheduledAt.After(a) {
								ran <- run.ScheduledAt
							}
							return nil
						}}})
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- r.Run(ctx) }()
				// Another process takes a just before r1 bids: r1 stands by
				// for it.
				time.Sleep(time.Until(a.Add(-time.Millisecond)))
				other := memory.New(store, "other")
				cl, err := claim.ClaimOne(ctx, other, claim.Run{Job: "tick", At: a}, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				tc.end(t, ctx, other, cl, fc, b)
				select {
				case at := <-ran:
					if !at.Equal(b) {
						t.Fatalf("ran %v, want %v", at, b)
					}
				case <-time.After(9 * time.Second):
					recs, _ := other.History(ctx, "tick", 3)
					t.Fatalf("%v did not run: history %+v", b, recs)
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// release ends cl as status.
func release(t *testing.T, ctx context.Context, c claim.Claimer, cl *claim.Claim, status claim.Status) {
	t.Helper()
	if errs := c.Release(ctx, []*claim.Claim{cl}, []claim.Status{status}); errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// countedReads counts the history reads that reach a claimer.
type countedReads struct {
	claim.Claimer
	reads *atomic.Int32
}

func (c countedReads) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	c.reads.Add(1)
	return c.Claimer.History(ctx, job, limit)
}

// TestAGrantsPageIsTheOverlapProbesFirstRead: where the backend hands
// each grant its job's page of records (claim.Claim.Page, read in the
// grant's own step), a forbid job's runs start without a history read of
// their own; where it does not, each run's probe reads once. Either way
// the runs neither overlap nor go missing.
func TestAGrantsPageIsTheOverlapProbesFirstRead(t *testing.T) {
	for _, pages := range []bool{false, true} {
		t.Run(fmt.Sprintf("pages=%v", pages), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore(nil)
				if pages {
					store.GrantPages()
				}
				led := newLedger()
				var reads, started, running, overlaps atomic.Int32
				jobs := []runner.Job{{Name: "paged", Schedule: mustSchedule(t, "@every 1s"), Overlap: runner.OverlapForbid,
					Handler: func(ctx context.Context, run job.Run) error {
						started.Add(1)
						if running.Add(1) > 1 {
							overlaps.Add(1)
						}
						defer running.Add(-1)
						time.Sleep(100 * time.Millisecond)
						return nil
					}}}
				var reps []*replica
				for _, name := range []string{"a", "b"} {
					// No sweep in the test's time: its reads are not the probe's.
					rp := &replica{name: name, store: store, jobs: jobs, led: led, sweep: time.Hour,
						wrap: func(c claim.Claimer) claim.Claimer { return countedReads{c, &reads} }}
					rp.start(t)
					reps = append(reps, rp)
				}
				// Start-up recovery's reads are done by now. The window
				// opens and closes half-way between due instants: opened
				// at one, it could count a run whose probe read before it.
				time.Sleep(3500 * time.Millisecond)
				reads.Store(0)
				before := started.Load()
				time.Sleep(10 * time.Second)
				for _, rp := range reps {
					rp.stop()
				}
				ran, read := started.Load()-before, reads.Load()
				if ran < 9 {
					t.Fatalf("%d runs started in 10s of a job due every second, want 9 or more", ran)
				}
				if overlaps.Load() != 0 {
					t.Errorf("%d runs started while another ran", overlaps.Load())
				}
				switch {
				case pages && read != 0:
					t.Errorf("%d history reads for %d runs, with every grant's page in hand: want none", read, ran)
				case !pages && read < ran:
					t.Errorf("%d history reads for %d runs without pages: want one or more a run", read, ran)
				}
				led.check(t, history.Spec{Forbid: map[string]bool{"paged": true}})
			})
		})
	}
}

// rewoundLeases shows every live run of its claimer's history with a
// lease that lapsed a moment ago, from stale on: as a Redis server gone
// back to an older copy of its data shows a run whose renewals since
// the copy it lost.
type rewoundLeases struct {
	claim.Claimer
	stale *atomic.Bool
}

func (w rewoundLeases) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	recs, err := w.Claimer.History(ctx, job, limit)
	if err != nil || !w.stale.Load() {
		return recs, err
	}
	recs = slices.Clone(recs)
	for i := range recs {
		if recs[i].Status == claim.Running {
			recs[i].LeaseUntil = time.Now().Add(-time.Millisecond)
		}
	}
	return recs, nil
}

// TestARunExecutingHereIsLiveWhateverItsRecordSays: a replica executing
// a run of a buffer-one job, its lease renewed, reads the run's record
// back with its lease lapsed (the server went back to a copy taken
// before its last renewals). The job's next run, granted to the same
// replica, waits for the one it executes. Before, the probe believed the
// record over what the replica itself held, and started the next run
// beside it (the explorer's job-overlap on Redis, seed 50000029 at the
// nemesis's time scale: both runs on one replica, under a rewind).
func TestARunExecutingHereIsLiveWhateverItsRecordSays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, led := memory.NewStore(nil), newLedger()
		var stale atomic.Bool
		var counted overlapping
		t0 := time.Now().Truncate(2 * time.Second)
		first := t0.Add(2 * time.Second)
		jobs := []runner.Job{{Name: "q", Schedule: mustSchedule(t, "*/2 * * * * *"), Overlap: runner.OverlapBufferOne,
			// The first run still runs at the next instant.
			Handler: counted.handler(func(run job.Run) bool { return run.ScheduledAt.Equal(first) }, 3*time.Second)}}
		rp := &replica{name: "a", store: store, jobs: jobs, led: led, lease: time.Second,
			wrap: func(c claim.Claimer) claim.Claimer { return rewoundLeases{c, &stale} }}
		time.Sleep(time.Until(t0.Add(time.Second)))
		rp.start(t)
		time.Sleep(time.Until(first.Add(500 * time.Millisecond)))
		stale.Store(true)
		time.Sleep(time.Until(t0.Add(8 * time.Second)))
		rp.stop()
		if n := counted.overlaps.Load(); n != 0 {
			t.Errorf("%d runs of the buffer-one job started while another executed on the same replica", n)
		}
		next := claim.Run{Job: "q", At: t0.Add(4 * time.Second)}
		if s := led.starts(next.ID()); len(s) != 1 {
			led.explain(t, next.ID())
			t.Errorf("%s started %d times, want once, after %s", next.ID(), len(s), first.Format(time.TimeOnly))
		}
	})
}

// renewalsCut fails every renewal of run from cut on (the backend out of
// reach), and holds every release of it until then plus hold: as a
// replica paused past its lease, whose release then waits out an outage.
type renewalsCut struct {
	claim.Claimer
	run       claim.Run
	cut, hold time.Time
}

func (c *renewalsCut) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	if cl.ID() == c.run.ID() && !time.Now().Before(c.cut) {
		return fmt.Errorf("renew %s: %w", cl.ID(), claim.ErrUnavailable)
	}
	return c.Claimer.Renew(ctx, cl, lease)
}

func (c *renewalsCut) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	for _, cl := range cls {
		if cl.ID() == c.run.ID() {
			time.Sleep(time.Until(c.hold))
		}
	}
	return c.Claimer.Release(ctx, cls, outs)
}

// TestARunWhoseLeaseIsNoLongerTrustedHereIsNoOverlap: a forbid job's run
// could not renew its lease (its replica cut off, or paused past it), so
// its holder stopped trusting the lease and ended it, and its release
// waits for the backend. The job's next instant comes meanwhile: the
// run still counted as executing on its replica, which skipped the
// instant for good, though the run's lease had lapsed and every other
// replica counted it ended (the explorer's skipped-idle, in-process seed
// 60000450). A run whose lease its replica no longer trusts is no
// overlap.
func TestARunWhoseLeaseIsNoLongerTrustedHereIsNoOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, led := memory.NewStore(nil), newLedger()
		t0 := time.Now().Truncate(2 * time.Second)
		r0, r1 := claim.Run{Job: "f", At: t0.Add(2 * time.Second)}, claim.Run{Job: "f", At: t0.Add(4 * time.Second)}
		var counted overlapping
		jobs := []runner.Job{{Name: "f", Schedule: mustSchedule(t, "*/2 * * * * *"), Overlap: runner.OverlapForbid,
			Handler: counted.handler(func(run job.Run) bool { return run.ScheduledAt.Equal(r0.At) }, time.Minute)}}
		rp := &replica{name: "a", store: store, jobs: jobs, led: led, lease: time.Second,
			wrap: func(c claim.Claimer) claim.Claimer {
				// Cut off 300ms into r0; its release lands 4.5s later.
				return &renewalsCut{Claimer: c, run: r0, cut: r0.At.Add(300 * time.Millisecond), hold: r0.At.Add(4800 * time.Millisecond)}
			}}
		time.Sleep(time.Until(t0.Add(time.Second)))
		rp.start(t)
		time.Sleep(time.Until(t0.Add(8 * time.Second)))
		rp.stop()
		if s := led.starts(r1.ID()); len(s) != 1 {
			led.explain(t, r1.ID())
			t.Errorf("%s started %d times, want once: %s's lease had lapsed, and its holder ended it", r1.ID(), len(s), r0.ID())
		}
		if n := counted.overlaps.Load(); n != 0 {
			t.Errorf("%d runs of the forbid job started while another executed", n)
		}
	})
}
