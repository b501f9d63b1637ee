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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// countingHourly is an hourly job whose handler counts its runs in ran,
// by run id, under mu.
func countingHourly(t *testing.T) ([]runner.Job, *sync.Mutex, map[string]int) {
	mu, ran := &sync.Mutex{}, map[string]int{}
	return []runner.Job{{Name: "hourly", Schedule: mustSchedule(t, "0 0 * * * *"),
		Handler: func(ctx context.Context, run job.Run) error {
			mu.Lock()
			defer mu.Unlock()
			ran[run.ID]++
			return nil
		}}}, mu, ran
}

// A backfill of 100 instants, half of them already run, runs exactly the
// other half, once, however many backfills race; --rerun failed then
// reruns the failed ones under their own run ids, and a missed instant
// (it never started) is run by any backfill.
func TestBackfillRunsExactlyTheInstantsThatNeverRan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		jobs, mu, ran := countingHourly(t)
		from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(from.Add(200 * time.Hour)))
		to := from.Add(99 * time.Hour)
		pre := memory.New(store, "earlier")
		ctx := context.Background()
		want := map[string]bool{}
		for i := range 100 {
			run := claim.Run{Job: "hourly", At: from.Add(time.Duration(i) * time.Hour)}
			if i%2 == 1 {
				want[run.ID()] = true
				continue
			}
			cl, err := claim.ClaimOne(ctx, pre, run, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			st := claim.Succeeded
			switch i {
			case 10, 20:
				st = claim.Failed
			case 30:
				st = claim.Missed
				// Never started: a backfill runs it, under a rerun's id.
				want[claim.Run{Job: run.Job, At: run.At.Add(1)}.ID()] = true
			}
			if err := claim.ReleaseOne(ctx, pre, cl, st); err != nil {
				t.Fatal(err)
			}
		}
		newRunner := func(name string) *runner.Runner {
			r, err := runner.New(runner.Options{Claimer: memory.New(store, name), Instance: name, Lease: 3 * time.Second}, jobs)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		// A dry run plans without running.
		plan, sum, err := newRunner("dry").Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, DryRun: true})
		if err != nil || sum.Instants != 100 || sum.Planned != 51 || len(ran) != 0 || len(plan) != 100 {
			t.Fatalf("dry run: %+v %v, ran %d", sum, err, len(ran))
		}
		var wg sync.WaitGroup
		for _, name := range []string{"b1", "b2", "b3"} {
			wg.Go(func() {
				items, s, err := newRunner(name).Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, MaxConcurrent: 4})
				if err != nil || s.Errors != 0 || s.Failed != 0 {
					t.Errorf("%s: %+v %v", name, s, err)
					for _, it := range items {
						if it.Status != "succeeded" && it.Action != runner.ActionKeep {
							t.Logf("%+v", it)
						}
					}
				}
			})
		}
		wg.Wait()
		mu.Lock()
		if len(ran) != 51 {
			t.Errorf("ran %d distinct runs, want 51", len(ran))
		}
		for id, n := range ran {
			if !want[id] && n > 0 {
				t.Errorf("%s ran though it had run before the backfill", id)
			}
			if n != 1 {
				t.Errorf("%s ran %d times", id, n)
			}
		}
		clear(ran)
		mu.Unlock()

		items, sum, err := newRunner("again").Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, Rerun: runner.RerunFailed})
		if err != nil || sum.Planned != 2 || sum.Succeeded != 2 {
			t.Fatalf("rerun failed: %+v %v", sum, err)
		}
		for _, it := range items {
			if it.Action == runner.ActionRerun {
				r, _ := claim.ParseID(it.RunID)
				if it.Was != string(claim.Failed) || r.At.Sub(it.At) != 1 || ran[it.RunID] != 1 {
					t.Errorf("rerun %+v: want the failed instant + 1ns, run once", it)
				}
			}
		}
		if _, sum, _ := newRunner("third").Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, Rerun: runner.RerunFailed}); sum.Planned != 0 {
			t.Fatalf("a second rerun of failed runs plans %d, want 0: the reruns succeeded", sum.Planned)
		}
		if _, _, err := newRunner("x").Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: time.Now().Add(time.Hour)}); err == nil {
			t.Fatal("a backfill into the future was accepted")
		}
	})
}

// replyLost passes claims on, but answers the grant numbered lose (1:
// the first) with an error, as a reply lost on the way back would.
type replyLost struct {
	claim.Claimer
	lose    int32
	granted atomic.Int32
}

func (c *replyLost) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	cls, errs := c.Claimer.Claim(ctx, runs, lease)
	if errs[0] == nil && c.granted.Add(1) == max(c.lose, 1) {
		return make([]*claim.Claim, len(runs)), []error{fmt.Errorf("reply lost: %w", claim.ErrUnavailable)}
	}
	return cls, errs
}

// A backfill whose claim was granted but whose answer was lost asks
// again, finds the run held by that lost grant, waits for its lease to
// lapse, takes it over and runs it, once: it neither reports an error for
// a run it left live nor leaves that run to a later restart's recovery.
func TestBackfillTakesOverItsOwnGrantWhoseReplyWasLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		var ran atomic.Int32
		jobs := []runner.Job{{Name: "hourly", Schedule: mustSchedule(t, "0 0 * * * *"),
			Handler: func(ctx context.Context, run job.Run) error { ran.Add(1); return nil }}}
		from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(from.Add(3 * time.Hour)))
		r, err := runner.New(runner.Options{Claimer: &replyLost{Claimer: memory.New(store, "b")}, Instance: "b",
			Lease: 3 * time.Second}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		items, sum, err := r.Backfill(context.Background(), "hourly", runner.BackfillOptions{From: from, To: from})
		if err != nil || sum.Succeeded != 1 || sum.Errors != 0 || len(items) != 1 || items[0].Status != string(claim.Succeeded) {
			t.Fatalf("backfill: %+v, items %+v, %v; want the one instant succeeded", sum, items, err)
		}
		if n := ran.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want once", n)
		}
		recs, err := memory.New(store, "reader").History(context.Background(), "hourly", 0)
		if err != nil || len(recs) != 1 || recs[0].Status != claim.Succeeded || recs[0].Attempt != 2 {
			t.Fatalf("history %+v, %v: want one run, succeeded as attempt 2 (the lost grant's takeover)", recs, err)
		}
	})
}

// So does a trigger, and a trigger's retry: a trigger's manual instant is
// its own, so the run found held after the lost answer can only be its
// own grant, taken over as the next attempt and run, not left live.
func TestTriggerTakesOverItsOwnGrantWhoseReplyWasLost(t *testing.T) {
	for _, tc := range []struct {
		name         string
		lose         int32 // which grant's answer is lost
		failFirst    bool
		ran, attempt int
	}{
		{name: "first attempt", lose: 1, ran: 1, attempt: 2},
		{name: "retry", lose: 2, failFirst: true, ran: 2, attempt: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore(nil)
				var ran atomic.Int32
				jobs := []runner.Job{{Name: "report", Schedule: mustSchedule(t, "0 0 * * * *"), MaxAttempts: 5, Backoff: time.Second,
					Handler: func(ctx context.Context, run job.Run) error {
						if ran.Add(1) == 1 && tc.failFirst {
							return errors.New("first attempt fails")
						}
						return nil
					}}}
				r, err := runner.New(runner.Options{Claimer: &replyLost{Claimer: memory.New(store, "cli"), lose: tc.lose},
					Instance: "cli", Lease: 3 * time.Second}, jobs)
				if err != nil {
					t.Fatal(err)
				}
				if st, err := r.Trigger(context.Background(), "report", runner.TriggerOptions{}); err != nil || st != claim.Succeeded {
					t.Fatalf("trigger: %q, %v; want succeeded", st, err)
				}
				recs, err := memory.New(store, "reader").History(context.Background(), "report", 0)
				if n := ran.Load(); int(n) != tc.ran || err != nil || len(recs) != 1 || recs[0].Status != claim.Succeeded || recs[0].Attempt != tc.attempt {
					t.Fatalf("ran %d times, history %+v, %v: want %d, one run succeeded as attempt %d", n, recs, err, tc.ran, tc.attempt)
				}
			})
		})
	}
}

// A backfill that was killed (SIGKILL: its claim never released) or
// stopped (SIGTERM: handed back interrupted) left past instants live,
// and no replica's schedule watches a past instant. Run again, the
// backfill contends for them: one whose holder died is taken over once
// its lease lapsed and run here; one handed back is taken over at once;
// one whose holder still renews it is left to that holder, reported
// held, after a lease of waiting.
func TestBackfillResumesTheLiveInstantsAnEarlierBackfillLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		resumesLiveInstants(t, func(c *memory.Claimer) claim.Claimer { return c })
	})
}

// TestABackfillBegunHeldResumesTheLiveInstantsOnceItsHoldEnds: the
// backfill's process starts with takeovers held (claim.Unanswered.Start),
// here for longer than the lease and the clock skew it asks a live run
// for: the run whose holder died answers "held" meanwhile. It is taken
// over once the hold ends, not reported held elsewhere.
func TestABackfillBegunHeldResumesTheLiveInstantsOnceItsHoldEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		resumesLiveInstants(t, func(c *memory.Claimer) claim.Claimer {
			return &startHeld{Claimer: c, until: time.Now().Add(10 * time.Second)}
		})
	})
}

// startHeld is a memory claimer that, as a networked one begun now,
// takes no lapsed lease over until a time.
type startHeld struct {
	*memory.Claimer
	until time.Time
}

func (s *startHeld) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	return s.ClaimHolding(ctx, runs, lease, s.TakeoversHeld(lease))
}

func (s *startHeld) TakeoversHeld(time.Duration) bool { return time.Now().Before(s.until) }

// resumesLiveInstants is TestBackfillResumesTheLiveInstantsAnEarlierBackfillLeft
// with the backfill's claimer made by wrap.
func resumesLiveInstants(t *testing.T, wrap func(*memory.Claimer) claim.Claimer) {
	store := memory.NewStore(nil)
	jobs, mu, ran := countingHourly(t)
	from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
	time.Sleep(time.Until(from.Add(40 * time.Hour)))
	to := from.Add(29 * time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	at := func(h int) claim.Run { return claim.Run{Job: "hourly", At: from.Add(time.Duration(h) * time.Hour)} }
	// The earlier backfill: instants 0–29 ran, but for 3 (its process
	// was killed while it ran), 7 (stopped: handed back) and 11 (still
	// running on a process that renews it).
	earlier := memory.New(store, "earlier")
	var live *claim.Claim
	for h := range 30 {
		cl, err := claim.ClaimOne(ctx, earlier, at(h), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		switch h {
		case 3:
			continue
		case 7:
			err = claim.ReleaseOne(ctx, earlier, cl, claim.Interrupted)
		case 11:
			live = cl
			continue
		default:
			err = claim.ReleaseOne(ctx, earlier, cl, claim.Succeeded)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	renewing := make(chan struct{})
	defer func() { cancel(); <-renewing }()
	go func() {
		defer close(renewing)
		for ctx.Err() == nil {
			time.Sleep(time.Second)
			if err := earlier.Renew(ctx, live, 3*time.Second); err != nil && ctx.Err() == nil {
				t.Errorf("renew %s: %v", live.ID(), err)
				return
			}
		}
	}()
	r, err := runner.New(runner.Options{Claimer: wrap(memory.New(store, "again")), Instance: "again", Lease: 3 * time.Second}, jobs)
	if err != nil {
		t.Fatal(err)
	}
	items, sum, err := r.Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, MaxConcurrent: 4})
	if err != nil || sum.Planned != 3 || sum.Succeeded != 2 || sum.Elsewhere != 1 || sum.Errors != 0 {
		t.Fatalf("backfill: %+v %v; want 3 planned: 2 succeeded here, 1 held elsewhere", sum, err)
	}
	want := map[string]string{at(3).ID(): "succeeded", at(7).ID(): "succeeded", at(11).ID(): "held"}
	for _, it := range items {
		if w, ok := want[it.RunID]; ok && (it.Action != runner.ActionResume || it.Status != w) {
			t.Errorf("%s: %+v, want action %s, status %s", it.RunID, it, runner.ActionResume, w)
		}
	}
	mu.Lock()
	if len(ran) != 2 || ran[at(3).ID()] != 1 || ran[at(7).ID()] != 1 {
		t.Errorf("ran %v, want instants 3 and 7 once each", ran)
	}
	mu.Unlock()
	recs, err := memory.New(store, "reader").History(ctx, "hourly", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		switch rec.RunID {
		case at(3).ID(), at(7).ID():
			if rec.Status != claim.Succeeded || rec.Attempt != 2 {
				t.Errorf("%s: %s attempt %d, want succeeded as attempt 2 (a takeover)", rec.RunID, rec.Status, rec.Attempt)
			}
		case at(11).ID():
			if rec.Status != claim.Running || rec.Attempt != 1 {
				t.Errorf("%s: %s attempt %d, want still running as attempt 1 (its holder lives)", rec.RunID, rec.Status, rec.Attempt)
			}
		}
	}
}

// A --rerun backfill killed or stopped mid-way leaves its reruns live
// (instant + k ns), beside the instants' own runs, done. Run again, with
// any rerun policy, the backfill resumes those reruns, not the instants:
// resumed under the instant's own run id, which is done, they were
// reported done elsewhere and left live for good (an outside review).
func TestBackfillResumesTheRerunsAnEarlierBackfillLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		jobs, mu, ran := countingHourly(t)
		from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(from.Add(10 * time.Hour)))
		to := from.Add(5 * time.Hour)
		ctx := t.Context()
		earlier := memory.New(store, "earlier")
		rerun := func(h, k int) claim.Run {
			return claim.Run{Job: "hourly", At: from.Add(time.Duration(h)*time.Hour + time.Duration(k))}
		}
		// Every instant ran; its rerun (k = 1) was then killed (left
		// running) for 0-2, stopped (handed back) for 3-5.
		for h := range 6 {
			for k, out := range []claim.Status{claim.Succeeded, claim.Interrupted} {
				cl, err := claim.ClaimOne(ctx, earlier, rerun(h, k), 3*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if k == 1 && h < 3 {
					continue
				}
				if err := claim.ReleaseOne(ctx, earlier, cl, out); err != nil {
					t.Fatal(err)
				}
			}
		}
		r, err := runner.New(runner.Options{Claimer: memory.New(store, "again"), Instance: "again", Lease: 3 * time.Second}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		items, sum, err := r.Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, Rerun: runner.RerunFailed, MaxConcurrent: 3})
		if err != nil || sum.Planned != 6 || sum.Succeeded != 6 || sum.Elsewhere != 0 {
			t.Fatalf("backfill: %+v %v; want the 6 reruns resumed and succeeded here", sum, err)
		}
		for _, it := range items {
			if h := int(it.At.Sub(from) / time.Hour); it.RunID != rerun(h, 1).ID() || it.Action != runner.ActionResume {
				t.Errorf("%+v, want %s resumed", it, rerun(h, 1).ID())
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for h := range 6 {
			if ran[rerun(h, 1).ID()] != 1 || ran[rerun(h, 0).ID()] != 0 {
				t.Errorf("ran %v: want each rerun once, no instant again", ran)
				break
			}
		}
	})
}

// A backfill stopped (its context ends: the replica whose API started it
// got SIGTERM) starts no further instant, and gives the handlers running
// Grace to finish, as a replica's shutdown gives its runs shutdown_grace;
// past it, or with none, they are cancelled and handed back interrupted.
// (An outside review saw an API backfill's run handed back 3ms after
// SIGTERM, under a grace of 5s.)
func TestAStoppedBackfillGivesItsRunningHandlersTheirGrace(t *testing.T) {
	for _, tc := range []struct {
		grace  time.Duration
		status string
	}{{5 * time.Second, string(claim.Succeeded)}, {time.Second, string(claim.Interrupted)}, {0, string(claim.Interrupted)}} {
		t.Run(tc.grace.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore(nil)
				started := make(chan struct{}, 10)
				jobs := []runner.Job{{Name: "hourly", Schedule: mustSchedule(t, "0 0 * * * *"),
					Handler: func(ctx context.Context, run job.Run) error {
						started <- struct{}{}
						select {
						case <-time.After(3 * time.Second):
							return nil
						case <-ctx.Done():
							return ctx.Err()
						}
					}}}
				from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
				time.Sleep(time.Until(from.Add(10 * time.Hour)))
				r, err := runner.New(runner.Options{Claimer: memory.New(store, "api"), Instance: "api", Lease: 3 * time.Second}, jobs)
				if err != nil {
					t.Fatal(err)
				}
				ctx, stop := context.WithCancel(context.Background())
				go func() { <-started; time.Sleep(500 * time.Millisecond); stop() }()
				items, sum, _ := r.Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: from.Add(4 * time.Hour), Grace: tc.grace})
				if sum.Settled != 1 || len(started) != 0 {
					t.Fatalf("%+v: want one instant started and settled, none after the stop", sum)
				}
				for _, it := range items {
					if it.Status != "" && it.Status != tc.status {
						t.Errorf("%s ended %s, want %s", it.RunID, it.Status, tc.status)
					}
				}
			})
		})
	}
}

// renewFails passes every call on but the renewals of attempt 1, which
// never reach the backend: its holder loses its lease mid-run.
type renewFails struct{ claim.Claimer }

func (c renewFails) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	if cl.Attempt == 1 {
		return fmt.Errorf("renewal lost: %w", claim.ErrUnavailable)
	}
	return c.Claimer.Renew(ctx, cl, lease)
}

// A backfill's run (a trigger's alike) whose lease was lost under it is
// handed back live, and nothing stands by for a past instant: the
// backfill takes it over and runs it to its end, as attempt 2, rather
// than reporting it failed and leaving it live (explorer seed 70, among
// the first seeds once backfills were explored).
func TestBackfillCarriesOnARunWhoseLeaseWasLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		var calls atomic.Int32
		jobs := []runner.Job{{Name: "hourly", Schedule: mustSchedule(t, "0 0 * * * *"),
			Handler: func(ctx context.Context, run job.Run) error {
				if calls.Add(1) == 1 {
					<-ctx.Done() // works until its lease is lost
					return context.Cause(ctx)
				}
				return nil
			}}}
		from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(from.Add(3 * time.Hour)))
		r, err := runner.New(runner.Options{Claimer: renewFails{memory.New(store, "b")}, Instance: "b", Lease: 3 * time.Second}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		items, sum, err := r.Backfill(context.Background(), "hourly", runner.BackfillOptions{From: from, To: from})
		if err != nil || sum.Succeeded != 1 || len(items) != 1 || items[0].Status != string(claim.Succeeded) {
			t.Fatalf("backfill: %+v, items %+v, %v; want the instant succeeded", sum, items, err)
		}
		recs, err := memory.New(store, "reader").History(context.Background(), "hourly", 0)
		if err != nil || len(recs) != 1 || recs[0].Status != claim.Succeeded || recs[0].Attempt != 2 || calls.Load() != 2 {
			t.Fatalf("history %+v, %v, %d calls: want one run, succeeded as attempt 2", recs, err, calls.Load())
		}
	})
}

// lossyAfter passes every call on, but from the second grant on it loses
// every claim's answer until the deadline, as a link that drops replies
// would: grants land, and their holder never hears of them.
type lossyAfter struct {
	claim.Claimer
	until   time.Time
	granted atomic.Int32
}

func (c *lossyAfter) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	cls, errs := c.Claimer.Claim(ctx, runs, lease)
	if errs[0] == nil && c.granted.Add(1) > 1 && time.Now().Before(c.until) {
		return make([]*claim.Claim, len(runs)), []error{fmt.Errorf("reply lost: %w", claim.ErrUnavailable)}
	}
	return cls, errs
}

// A backfill that cannot carry a run on (its retry's answers lost for
// longer than it asks) reports an error for that instant, not a failure:
// the run may be left live. Run again, the backfill resumes it (explorer
// seed 129172, where the retry's grant was left live and the backfill
// counted the instant failed, so the operator thought it settled).
func TestBackfillReportsARunItCouldNotCarryOnAndResumesItLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		var calls atomic.Int32
		jobs := []runner.Job{{Name: "hourly", Schedule: mustSchedule(t, "0 0 * * * *"), MaxAttempts: 3, Backoff: time.Second,
			Handler: func(ctx context.Context, run job.Run) error {
				if calls.Add(1) == 1 {
					return errors.New("first attempt fails")
				}
				return nil
			}}}
		from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(from.Add(3 * time.Hour)))
		lossy := &lossyAfter{Claimer: memory.New(store, "b1"), until: time.Now().Add(time.Hour)}
		newRunner := func(c claim.Claimer, name string) *runner.Runner {
			r, err := runner.New(runner.Options{Claimer: c, Instance: name, Lease: 3 * time.Second}, jobs)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		opts := runner.BackfillOptions{From: from, To: from}
		items, sum, _ := newRunner(lossy, "b1").Backfill(context.Background(), "hourly", opts)
		if sum.Errors != 1 || sum.Failed != 0 || len(items) != 1 || items[0].Error == "" {
			t.Fatalf("first backfill: %+v, items %+v; want the instant reported as an error, not failed", sum, items)
		}
		items, sum, err := newRunner(memory.New(store, "b2"), "b2").Backfill(context.Background(), "hourly", opts)
		if err != nil || sum.Succeeded != 1 || items[0].Action != runner.ActionResume {
			t.Fatalf("second backfill: %+v, items %+v, %v; want the instant resumed and succeeded", sum, items, err)
		}
		if n := calls.Load(); n != 2 {
			t.Fatalf("the handler ran %d times, want twice (the failed attempt, then the resumed one)", n)
		}
	})
}

// A backfill's runs, of instants a month old, are not schedule lag: the
// lag histogram counts the schedule's runs only. A backfill once put 30
// days of "lag" in it per run (an outside review), enough to fire the
// lag alert.
func TestABackfillsRunsAreNotScheduleLag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		jobs, mu, ran := countingHourly(t)
		from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(from.Add(30 * 24 * time.Hour)))
		reg := prometheus.NewRegistry()
		r, err := runner.New(runner.Options{Claimer: memory.New(store, "b"), Instance: "b", Lease: 3 * time.Second,
			Metrics: runner.NewMetrics(reg)}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		_, sum, err := r.Backfill(context.Background(), "hourly", runner.BackfillOptions{From: from, To: from.Add(2 * time.Hour)})
		if err != nil || sum.Succeeded != 3 {
			t.Fatalf("backfill: %+v %v", sum, err)
		}
		mu.Lock()
		n := len(ran)
		mu.Unlock()
		if n != 3 {
			t.Fatalf("ran %d runs, want the 3 backfilled", n)
		}
		if got := testutil.CollectAndCount(reg, "scheduler_schedule_lag_seconds"); got != 0 {
			t.Errorf("the lag histogram has %d series after a backfill of 3 month-old instants, want none", got)
		}
	})
}

// --rerun skipped runs again the instants whose last run was skipped (a
// pause, or overlap: they never ran), under a rerun's id, and keeps the
// rest; --rerun none keeps them. A paused window could only be run with
// --rerun all, which reran its successes too (an outside review).
func TestABackfillRerunsSkippedInstantsWhenAsked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		jobs, mu, ran := countingHourly(t)
		from := time.Now().UTC().Truncate(time.Hour).Add(time.Hour)
		time.Sleep(time.Until(from.Add(24 * time.Hour)))
		pre := memory.New(store, "earlier")
		ctx := context.Background()
		statuses := []claim.Status{claim.Succeeded, claim.Skipped, claim.Failed, claim.Skipped}
		for i, st := range statuses {
			cl, err := claim.ClaimOne(ctx, pre, claim.Run{Job: "hourly", At: from.Add(time.Duration(i) * time.Hour)}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := claim.ReleaseOne(ctx, pre, cl, st); err != nil {
				t.Fatal(err)
			}
		}
		r, err := runner.New(runner.Options{Claimer: memory.New(store, "b"), Instance: "b", Lease: 3 * time.Second}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		to := from.Add(time.Duration(len(statuses)-1) * time.Hour)
		if _, sum, err := r.Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to}); err != nil || sum.Planned != 0 || sum.Kept != 4 {
			t.Fatalf("--rerun none over recorded instants: %+v %v, want all 4 kept", sum, err)
		}
		items, sum, err := r.Backfill(ctx, "hourly", runner.BackfillOptions{From: from, To: to, Rerun: runner.RerunSkipped})
		if err != nil || sum.Planned != 2 || sum.Succeeded != 2 || sum.Kept != 2 {
			t.Fatalf("--rerun skipped: %+v %v, want the 2 skipped run and the rest kept", sum, err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, it := range items {
			skipped := it.Was == string(claim.Skipped)
			if (it.Action == runner.ActionRerun) != skipped || skipped && ran[it.RunID] != 1 {
				t.Errorf("%+v: ran %d; want the skipped instants rerun once, under a rerun's id, and nothing else", it, ran[it.RunID])
			}
		}
		if len(ran) != 2 {
			t.Errorf("ran %d runs, want 2", len(ran))
		}
	})
}
