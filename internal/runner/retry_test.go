package runner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

var errFlaky = errors.New("downstream unavailable")

// failUntil fails every attempt before attempt n (0: every attempt).
func failUntil(n int) job.Handler {
	return func(ctx context.Context, run job.Run) error {
		if n == 0 || run.Attempt < n {
			return fmt.Errorf("attempt %d: %w", run.Attempt, errFlaky)
		}
		return nil
	}
}

// checkAttempts asserts that run id was started once per attempt,
// 1…want, under strictly growing fences, and that each retry started
// only after its backoff (doubled per attempt from backoff) had passed
// since the attempt before it returned.
func checkAttempts(t *testing.T, led *ledger, id string, want int, backoff time.Duration) {
	t.Helper()
	starts := led.events(history.Start)[id]
	returns := led.events(history.Return)[id]
	if len(starts) != want || len(returns) != want {
		t.Fatalf("%s: %d starts and %d returns, want %d of each", id, len(starts), len(returns), want)
	}
	for i, s := range starts {
		cl := led.claimOf(s.Token)
		if cl.Attempt != i+1 {
			t.Errorf("%s: start %d ran attempt %d", id, i+1, cl.Attempt)
		}
		if i == 0 {
			continue
		}
		prev := led.claimOf(starts[i-1].Token)
		if cl.Fence <= prev.Fence {
			t.Errorf("%s: attempt %d has fence %d, not above attempt %d's %d", id, cl.Attempt, cl.Fence, prev.Attempt, prev.Fence)
		}
		wait := backoff << (i - 1)
		if gap := s.At.Sub(returns[i-1].At); gap < wait {
			t.Errorf("%s: attempt %d started %v after attempt %d returned, before its backoff %v", id, i+1, gap, i, wait)
		}
	}
}

// A failed run is retried inside the same run, by whichever replica claims
// it once the backoff (doubled per attempt) has passed, with attempt+1 and
// a higher fence, until it succeeds or max_attempts is spent; every failed
// attempt is recorded beside the run, and a retry pending when the next
// instant falls due obeys the overlap policy like a running run.
func TestRetriesRunTheSameRunAgainAfterBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		jobs := []runner.Job{
			{Name: "flaky", Schedule: mustSchedule(t, "0 * * * * *"), Handler: failUntil(3),
				MaxAttempts: 4, Backoff: 2 * time.Second},
			{Name: "doomed", Schedule: mustSchedule(t, "0 * * * * *"), Handler: failUntil(0),
				MaxAttempts: 2, Backoff: time.Second},
			// Its retry is pending when the next instant falls due.
			{Name: "slow-retry", Schedule: mustSchedule(t, "*/20 * * * * *"), Handler: failUntil(2),
				MaxAttempts: 2, Backoff: 30 * time.Second},
		}
		time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute - 5*time.Second)))
		minute := time.Now().UTC().Truncate(time.Minute).Add(time.Minute)
		rs := startReplicas(t, store, led, jobs, "a", "b", "c")
		time.Sleep(65 * time.Second)
		stopAll(rs)

		flaky := claim.Run{Job: "flaky", At: minute}.ID()
		checkAttempts(t, led, flaky, 3, 2*time.Second)
		if st := statuses(t, store, "flaky")[minute]; st != claim.Succeeded {
			t.Errorf("flaky ended %s, want succeeded on its third attempt", st)
		}
		doomed := claim.Run{Job: "doomed", At: minute}.ID()
		checkAttempts(t, led, doomed, 2, time.Second)
		if st := statuses(t, store, "doomed")[minute]; st != claim.Failed {
			t.Errorf("doomed ended %s, want failed once its 2 attempts were spent", st)
		}
		var ends []claim.Status
		for _, f := range led.finishes(doomed) {
			ends = append(ends, f.Status)
		}
		if fmt.Sprint(ends) != fmt.Sprint([]claim.Status{claim.Retrying, claim.Failed}) {
			t.Errorf("doomed's attempts ended %v, want [retrying failed]", ends)
		}

		// Every failed attempt is in the history beside the run.
		as, err := control.New(store.Controls(), nil).Attempts(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		by := control.AttemptsByRun(as)
		if got := by[flaky]; len(got) != 2 || got[0].Attempt != 1 || got[1].Attempt != 2 ||
			got[0].RetryAt.IsZero() || (got[1].RetryAt.Sub(got[1].Ended)-4*time.Second).Abs() > 100*time.Millisecond {
			t.Errorf("flaky's recorded attempts: %+v, want attempts 1 and 2, retried after 2s then 4s", got)
		}
		if got := by[doomed]; len(got) != 2 || !got[1].RetryAt.IsZero() || got[0].Error == "" {
			t.Errorf("doomed's recorded attempts: %+v, want 2, the last with no retry", got)
		}

		// slow-retry's first instant waits 30s for its retry: the instant
		// 20s later meets it held and is skipped (overlap: forbid).
		first := minute
		second := first.Add(20 * time.Second)
		st := statuses(t, store, "slow-retry")
		if st[second] != claim.Skipped {
			t.Errorf("slow-retry's %s: %s while the retry of %s was pending, want skipped", second.Format(time.TimeOnly), st[second], first.Format(time.TimeOnly))
		}
		if st[first] != claim.Succeeded {
			t.Errorf("slow-retry's %s: %s, want succeeded on its retry", first.Format(time.TimeOnly), st[first])
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"flaky": true, "doomed": true, "slow-retry": true}})
	})
}

// Takeovers after a crash and retries after a failure share one attempt
// count: a run interrupted once, then failing, is retried only up to
// max_attempts grants in all.
func TestRetriesAndTakeoversShareMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		started := make(chan string, 1)
		jobs := []runner.Job{{Name: "shared", Schedule: mustSchedule(t, "0 * * * * *"), MaxAttempts: 3, Backoff: time.Second,
			Handler: func(ctx context.Context, run job.Run) error {
				if run.Attempt == 1 {
					started <- run.Instance
					<-ctx.Done() // the replica is stopped under it
					return context.Cause(ctx)
				}
				return errFlaky
			}}}
		time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute - 5*time.Second)))
		minute := time.Now().UTC().Truncate(time.Minute).Add(time.Minute)
		rs := startReplicas(t, store, led, jobs, "a", "b", "c")
		holder := <-started
		for _, rp := range rs {
			if rp.name == holder {
				rp.stop() // shutdown_grace 0: interrupted, handed back
			}
		}
		time.Sleep(30 * time.Second)
		stopAll(rs)
		id := claim.Run{Job: "shared", At: minute}.ID()
		starts := led.events(history.Start)[id]
		if len(starts) != 3 {
			t.Fatalf("%s started %d times, want 3: one interrupted, two failed", id, len(starts))
		}
		if st := statuses(t, store, "shared")[minute]; st != claim.Failed {
			t.Errorf("%s ended %s, want failed after 3 attempts", id, st)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"shared": true}})
	})
}

// A run handed back at a shutdown (a rolling deploy) is taken over as the
// next attempt, but that attempt does not count against max_attempts: it
// did not fail and did not crash. With max_attempts 2, a run whose first
// two attempts were stopped by deploys runs a third time and succeeds,
// and the hand-backs show among its attempts (found by an outside review:
// three rolling restarts during a long run ended it failed, "attempt 4
// exceeds max_attempts 3"). A takeover after a crash still counts.
func TestAttemptsHandedBackAtAShutdownDoNotCountAgainstMaxAttempts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		crashes []bool // whether the replica of attempt 1, 2 crashes, not stopped
		want    claim.Status
	}{
		{name: "two deploys", crashes: []bool{false, false}, want: claim.Succeeded},
		{name: "a crash, then a deploy", crashes: []bool{true, false}, want: claim.Succeeded},
		{name: "two crashes", crashes: []bool{true, true}, want: claim.Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore(nil)
				at := time.Now().Truncate(time.Hour).Add(time.Hour)
				ran := make(chan int, 3)
				replica := func(name string, c *cutOff) (stop func()) {
					ctx, cancel := context.WithCancel(t.Context())
					r, err := runner.New(runner.Options{Claimer: c, Instance: name, Lease: 2 * time.Second,
						ShutdownGrace: 100 * time.Millisecond, Controls: control.New(store.Controls(), nil)},
						[]runner.Job{{Name: "long", Schedule: mustSchedule(t, "0 * * * *"), MaxAttempts: 2,
							Handler: func(ctx context.Context, run job.Run) error {
								ran <- run.Attempt
								if run.Attempt < 3 {
									<-ctx.Done()
									return context.Cause(ctx)
								}
								return nil
							}}})
					if err != nil {
						t.Fatal(err)
					}
					return runningCut(t, ctx, cancel, r, c.off.Load)
				}
				time.Sleep(time.Until(at.Add(-30 * time.Minute)))
				for i, crashes := range tc.crashes {
					c := &cutOff{Claimer: memory.New(store, fmt.Sprintf("r%d", i+1))}
					stop := replica(fmt.Sprintf("r%d", i+1), c)
					if i == 0 {
						time.Sleep(time.Until(at.Add(time.Second)))
					}
					if got := <-ran; got != i+1 {
						t.Fatalf("attempt %d, want %d", got, i+1)
					}
					if crashes {
						// Cut off from the backend as a crashed process
						// is: it renews nothing, hands nothing back, and
						// its lease lapses.
						c.off.Store(true)
						time.Sleep(3 * time.Second)
					}
					stop()
				}
				defer replica("r3", &cutOff{Claimer: memory.New(store, "r3")})()
				time.Sleep(10 * time.Second)
				synctest.Wait()
				recs, err := memory.New(store, "reader").History(t.Context(), "long", 0)
				if err != nil {
					t.Fatal(err)
				}
				id := claim.Run{Job: "long", At: at}.ID()
				for _, rec := range recs {
					if rec.RunID == id && (rec.Status != tc.want || rec.Attempt != 3) {
						t.Errorf("the run ended %s at attempt %d, want %s at attempt 3", rec.Status, rec.Attempt, tc.want)
					}
				}
				atts, err := control.New(store.Controls(), nil).Attempts(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				handedBack := 0
				for _, a := range atts {
					if a.Status == claim.Interrupted {
						handedBack++
						// Its handler ran until the deploy stopped it.
						if !a.Ended.After(a.Started) {
							t.Errorf("attempt %d handed back: started %s, ended %s; want how long it ran", a.Attempt, a.Started, a.Ended)
						}
					}
				}
				if deploys := len(tc.crashes) - count(tc.crashes, true); handedBack != deploys {
					t.Errorf("%d attempts recorded handed back after %d deploys: %+v", handedBack, deploys, atts)
				}
			})
		})
	}
}

// cutOff passes calls on until off, then fails them all, as a crashed
// process's would never arrive.
type cutOff struct {
	claim.Claimer
	off atomic.Bool
}

func (c *cutOff) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	if c.off.Load() {
		errs := make([]error, len(runs))
		for i := range errs {
			errs[i] = claim.ErrUnavailable
		}
		return make([]*claim.Claim, len(runs)), errs
	}
	return c.Claimer.Claim(ctx, runs, lease)
}

func (c *cutOff) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	if c.off.Load() {
		return claim.ErrUnavailable
	}
	return c.Claimer.Renew(ctx, cl, lease)
}

func (c *cutOff) Release(ctx context.Context, cls []*claim.Claim, outcomes []claim.Status) []error {
	if c.off.Load() {
		errs := make([]error, len(cls))
		for i := range errs {
			errs[i] = claim.ErrUnavailable
		}
		return errs
	}
	return c.Claimer.Release(ctx, cls, outcomes)
}

// count is how many of vs are v.
func count[T comparable](vs []T, v T) int {
	n := 0
	for _, x := range vs {
		if x == v {
			n++
		}
	}
	return n
}

// An attempt that fails while its replica shuts down (within the grace)
// is retried like any other, and recorded like any other: the record is
// its only trace (an outside review: every rolling deploy that caught a
// failing attempt lost it, "cannot record the failed attempt: context
// canceled").
func TestAnAttemptFailingDuringAShutdownIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		at := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		replica := func(name string) (stop func()) {
			ctx, cancel := context.WithCancel(t.Context())
			r, err := runner.New(runner.Options{Claimer: memory.New(store, name), Instance: name, Lease: 2 * time.Second,
				ShutdownGrace: 5 * time.Second, Controls: control.New(store.Controls(), nil)},
				[]runner.Job{{Name: "flaky", Schedule: mustSchedule(t, "0 * * * *"), MaxAttempts: 3, Backoff: time.Second,
					Handler: func(ctx context.Context, run job.Run) error {
						if run.Attempt == 1 {
							time.Sleep(time.Second) // past the shutdown, within its grace
							return errors.New("flaky: upstream said no")
						}
						return nil
					}}})
			if err != nil {
				t.Fatal(err)
			}
			return running(t, ctx, cancel, r)
		}
		time.Sleep(time.Until(at.Add(-time.Minute)))
		stop := replica("r1")
		time.Sleep(time.Until(at.Add(500 * time.Millisecond)))
		stop() // the attempt fails 0.5s into the grace
		defer replica("r2")()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		id := claim.Run{Job: "flaky", At: at}.ID()
		if st := statuses(t, store, "flaky")[at]; st != claim.Succeeded {
			t.Errorf("%s ended %s, want succeeded on its second attempt", id, st)
		}
		as, err := control.New(store.Controls(), nil).Attempts(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if len(as) != 1 || as[0].Attempt != 1 || as[0].Status != claim.Failed || as[0].Error != "flaky: upstream said no" {
			t.Errorf("recorded attempts %+v, want attempt 1, failed, with its error", as)
		}
	})
}

// uncuttable fails every renewal to other than lease: the setting of a
// lease to a retry's backoff (a backend out of reach just then, or a
// holder that died between its handler's return and that write).
type uncuttable struct {
	claim.Claimer
	lease time.Duration
}

func (u uncuttable) Renew(ctx context.Context, c *claim.Claim, lease time.Duration) error {
	if lease != u.lease {
		return fmt.Errorf("set to %v: %w", lease, claim.ErrUnavailable)
	}
	return u.Claimer.Renew(ctx, c, lease)
}

// A retry waits for its backoff even where the failed attempt's lease
// could not be cut to it: the lease then lapses at its last deadline,
// sooner than a backoff longer than the lease, and the replica that takes
// the run over finds the attempt's recorded retry time and waits for it.
// (A downstream that failed asked for the backoff; a retry a lease after
// the failure would hit it again.)
func TestARetryWaitsForItsBackoffWhereTheLeaseCouldNotBeCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		const lease, backoff = 3 * time.Second, 20 * time.Second
		jobs := []runner.Job{{Name: "flaky", Schedule: mustSchedule(t, "0 * * * * *"), Handler: failUntil(2),
			MaxAttempts: 3, Backoff: backoff}}
		time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute - 5*time.Second)))
		minute := time.Now().UTC().Truncate(time.Minute).Add(time.Minute)
		var rs []*replica
		for _, name := range []string{"a", "b", "c"} {
			rp := &replica{name: name, store: store, jobs: jobs, lease: lease, led: led,
				wrap: func(c claim.Claimer) claim.Claimer { return uncuttable{c, lease} }}
			rp.start(t)
			rs = append(rs, rp)
		}
		time.Sleep(40 * time.Second)
		stopAll(rs)

		flaky := claim.Run{Job: "flaky", At: minute}.ID()
		checkAttempts(t, led, flaky, 2, backoff)
		if st := statuses(t, store, "flaky")[minute]; st != claim.Succeeded {
			t.Errorf("flaky ended %s, want succeeded on its second attempt", st)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"flaky": true}})
	})
}

// TestAnAttemptWhoseReleaseWasRefusedIsRecorded: a holder whose handler
// finished while the backend could take no writes (a database locked
// past the lease) cannot end the run; its lease lapses, another replica
// takes the run over and runs it again, and the first holder's release,
// landing after, is refused. The backend's record is the takeover's, so
// the first attempt is recorded in the register, lease_lost, with how
// long it ran and why, and so is a hand-back's duration: else a run that
// executed twice showed one attempt (an outside review).
func TestAnAttemptWhoseReleaseWasRefusedIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		at := time.Now().Truncate(time.Hour).Add(time.Hour)
		first := &cutOff{Claimer: memory.New(store, "r1")}
		ran := make(chan int, 2)
		var returned atomic.Int64 // when attempt 1's handler returned (unix ns)
		replica := func(name string, c claim.Claimer) (stop func()) {
			ctx, cancel := context.WithCancel(t.Context())
			r, err := runner.New(runner.Options{Claimer: c, Instance: name, Lease: 2 * time.Second,
				Controls: control.New(store.Controls(), nil)},
				[]runner.Job{{Name: "nightly", Schedule: mustSchedule(t, "0 * * * *"),
					Handler: func(ctx context.Context, run job.Run) error {
						if run.Attempt == 1 {
							first.off.Store(true) // the backend takes no writes from here
							time.Sleep(time.Second)
							returned.Store(time.Now().UnixNano())
						}
						ran <- run.Attempt
						return nil
					}}})
			if err != nil {
				t.Fatal(err)
			}
			return running(t, ctx, cancel, r)
		}
		time.Sleep(time.Until(at.Add(-time.Minute)))
		defer replica("r1", first)()
		time.Sleep(time.Until(at.Add(-time.Millisecond)))
		if got := <-ran; got != 1 {
			t.Fatalf("attempt %d first, want 1", got)
		}
		// r1 only: r2 comes up once r1's handler has run.
		defer replica("r2", memory.New(store, "r2"))()
		if got := <-ran; got != 2 {
			t.Fatalf("attempt %d second, want the takeover's 2", got)
		}
		first.off.Store(false) // r1's release retries land now, refused
		time.Sleep(5 * time.Second)
		synctest.Wait()

		id := claim.Run{Job: "nightly", At: at}.ID()
		atts, err := control.New(store.Controls(), nil).Attempts(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if len(atts) != 1 {
			t.Fatalf("recorded attempts %+v, want r1's", atts)
		}
		a := atts[0]
		if a.Attempt != 1 || a.Holder != "r1" || a.Status != claim.LeaseLost || a.Ended.Sub(a.Started) < time.Second ||
			!strings.Contains(a.Error, "release was refused") {
			t.Fatalf("recorded %+v; want attempt 1 of r1, lease_lost, having run a second, its release refused", a)
		}
		// Dated by its handler's run, not by when the refusal came back
		// (an outside review: an attempt shown starting 19s after its
		// handler had started).
		if end := time.Unix(0, returned.Load()); a.Ended.Sub(end).Abs() > 10*time.Millisecond {
			t.Errorf("recorded as ended at %v, %v after its handler returned", a.Ended, a.Ended.Sub(end))
		}
		recs, err := memory.New(store, "reader").History(t.Context(), "nightly", 0)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(recs, func(r claim.Record) bool { return r.RunID == id })
		if i < 0 || recs[i].Attempt != 2 || recs[i].Status != claim.Succeeded {
			t.Fatalf("history %+v, want %s the takeover's, attempt 2, succeeded", recs, id)
		}
	})
}

// checkOverlapSkip checks that run, which never started, was skipped for
// overlap while prev, the instant before it, was still live: prev ended
// (its terminal release confirmed) after run fell due, or never did.
func checkOverlapSkip(t *testing.T, led *ledger, run, prev claim.Run) {
	t.Helper()
	skips := led.skipped()[run.ID()]
	if !slices.Contains(skips, runner.ReasonOverlap) {
		t.Errorf("%s: never started, and not skipped for overlap (skips: %v)", run.ID(), skips)
		led.explain(t, run.ID()) // what the replicas did about it, and the run before
		led.explain(t, prev.ID())
		return
	}
	var ended time.Time
	for _, e := range led.events(history.End)[prev.ID()] {
		if e.Status.Terminal() && e.At.After(ended) {
			ended = e.At
		}
	}
	if !ended.IsZero() && !ended.After(run.At) {
		t.Errorf("%s: skipped for overlap, but %s had ended at %s, before it fell due",
			run.ID(), prev.ID(), ended.Format("15:04:05.000"))
	}
}
