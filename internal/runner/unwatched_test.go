package runner_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

// A backfill's run sits at an old instant, behind every later run of its
// job: deeper in the history than the sweep reads (a minutely job, twenty
// runs since). Left by its process, it is taken over all the same,
// because the process named it in the register (control.Carry) and every
// replica reads that each tick. Three ways to leave it:
//   - a process killed after it named its run (its grant, one entry, then
//     nothing): taken over;
//   - a backfill stopped mid-run, which hands its run back: taken over;
//   - a process killed before it named its run: still live two minutes
//     later, which is what shows the entry did it (the sweep alone does
//     not reach that deep).
func TestAReplicaTakesOverAnOldBackfillRunItsProcessLeft(t *testing.T) {
	sched, err := schedule.Parse("* * * * *", "")
	if err != nil {
		t.Fatal(err)
	}
	const lease = 2 * time.Second
	for _, tc := range []struct {
		name  string
		leave func(t *testing.T, ctx context.Context, store *memory.Store, run claim.Run) *claim.Claim
		want  bool
	}{
		{name: "killed after naming its run", want: true, leave: func(t *testing.T, ctx context.Context, store *memory.Store, run claim.Run) *claim.Claim {
			carry(t, ctx, store, run, false)
			cl := grant(t, ctx, store, run, lease)
			carry(t, ctx, store, run, true)
			return cl
		}},
		{name: "killed as its bid went out", want: true, leave: func(t *testing.T, ctx context.Context, store *memory.Store, run claim.Run) *claim.Claim {
			carry(t, ctx, store, run, false)
			return grant(t, ctx, store, run, lease) // granted, but its answer never reached the process
		}},
		{name: "a backfill stopped mid-run", want: true, leave: func(t *testing.T, ctx context.Context, store *memory.Store, run claim.Run) *claim.Claim {
			started := make(chan int64, 1)
			bf, err := runner.New(runner.Options{Claimer: memory.New(store, "cli"), Instance: "cli", Lease: lease,
				Controls: control.New(store.Controls(), nil)},
				[]runner.Job{{Name: "report", Schedule: sched, Overlap: runner.OverlapAllow,
					Handler: func(ctx context.Context, r job.Run) error { started <- r.Fence; <-ctx.Done(); return ctx.Err() }}})
			if err != nil {
				t.Fatal(err)
			}
			bctx, stop := context.WithCancel(ctx)
			done := make(chan runner.BackfillSummary, 1)
			go func() {
				_, sum, _ := bf.Backfill(bctx, "report", runner.BackfillOptions{From: run.At, To: run.At})
				done <- sum
			}()
			fence := <-started
			stop()
			if sum := <-done; sum.Interrupted != 1 {
				t.Fatalf("the stopped backfill: %+v, want its run handed back", sum)
			}
			return &claim.Claim{Run: run, Fence: fence}
		}},
		{name: "killed before naming its run", leave: func(t *testing.T, ctx context.Context, store *memory.Store, run claim.Run) *claim.Claim {
			return grant(t, ctx, store, run, lease)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				store := memory.NewStore(time.Now)
				start := time.Now()
				run := claim.Run{Job: "report", At: start.Truncate(time.Hour).Add(-time.Hour)}
				ran := make(chan job.Run, 100)
				r, err := runner.New(runner.Options{Claimer: memory.New(store, "r1"), Instance: "r1", Lease: lease,
					Controls: control.New(store.Controls(), nil)},
					[]runner.Job{{Name: "report", Schedule: sched, Overlap: runner.OverlapAllow,
						Handler: func(ctx context.Context, r job.Run) error {
							if r.ScheduledAt.Equal(run.At) {
								ran <- r
							}
							return nil
						}}})
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- r.Run(ctx) }()
				time.Sleep(20 * time.Minute) // twenty runs of the job, each later than the backfill's instant

				cl := tc.leave(t, ctx, store, run)
				select {
				case got := <-ran:
					if !tc.want {
						t.Fatalf("run %s was taken over", got.ID)
					}
					if got.Attempt != 2 || got.Fence <= cl.Fence {
						t.Fatalf("ran %s attempt %d fence %d, want the left run taken over (attempt 2, fence above %d)",
							got.ID, got.Attempt, got.Fence, cl.Fence)
					}
				case <-time.After(2 * time.Minute):
					if tc.want {
						t.Fatal("the left run was not taken over within two minutes")
					}
				}
				synctest.Wait()
				want := claim.Running
				if tc.want {
					want = claim.Succeeded
				}
				if got := statusOf(t, ctx, store, run); got != want {
					t.Errorf("the left run is %s, want %s", got, want)
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// carry names run in the register as a process outside the fleet
// ("cli") does, before its bid and, granted, after it.
func carry(t *testing.T, ctx context.Context, store *memory.Store, run claim.Run, granted bool) {
	t.Helper()
	u := control.Unwatched{Job: run.Job, At: run.At, Holder: "cli", Since: time.Now(), Granted: granted}
	if err := control.New(store.Controls(), nil).Carry(ctx, u, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// grant claims run as a process outside the fleet ("cli") would.
func grant(t *testing.T, ctx context.Context, store *memory.Store, run claim.Run, lease time.Duration) *claim.Claim {
	t.Helper()
	cl, err := claim.ClaimOne(ctx, memory.New(store, "cli"), run, lease)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// statusOf reads run's status from the history.
func statusOf(t *testing.T, ctx context.Context, store *memory.Store, run claim.Run) claim.Status {
	t.Helper()
	recs, err := memory.New(store, "reader").History(ctx, run.Job, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if rec.RunID == run.ID() {
			return rec.Status
		}
	}
	t.Fatalf("%s is not in the history", run.ID())
	return ""
}

// A backfill runs its instants whatever the job's overlap policy, and one
// stopped mid-run hands its run back for the fleet to take over. The
// takeover must run beside live runs too: a forbid job whose scheduled
// runs (5s of work every second) are nearly always live would otherwise
// skip it for overlap, and the instant, recorded skipped, would never run
// (a backfill run again keeps it). Found by an outside review.
func TestAFleetTakeoverOfABackfillsRunIgnoresTheOverlapPolicyAsTheBackfillDid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store := memory.NewStore(time.Now)
		run, ran, done := backfillStoppedBesideLiveRuns(t, ctx, store, store.Controls(), func() {})
		select {
		case r := <-ran:
			if r.Instance != "r1" || r.Attempt != 2 {
				t.Errorf("the backfill's run ran as attempt %d on %s, want attempt 2 on r1", r.Attempt, r.Instance)
			}
		case <-time.After(time.Minute):
			t.Errorf("the fleet never ran the run the stopped backfill handed back; it is %s", statusOf(t, ctx, store, run))
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if st := statusOf(t, context.Background(), store, run); st != claim.Succeeded {
			t.Errorf("the backfill's run ended %s, want succeeded", st)
		}
	})
}

// backfillStoppedBesideLiveRuns starts a replica of the fleet ("r1") on
// a forbid job whose scheduled runs (5s of work every second) are nearly
// always live, with fleetControls as its register; 10s later, after
// before, a backfill of the job's run an hour back ("cli"), stopped as
// soon as its handler starts, hands that run back. It returns the run,
// the fleet's executions of it and the fleet's end.
func backfillStoppedBesideLiveRuns(t *testing.T, ctx context.Context, store *memory.Store, fleetControls claim.Controls, before func()) (claim.Run, <-chan job.Run, <-chan error) {
	sched, err := schedule.Parse("* * * * * *", "")
	if err != nil {
		t.Fatal(err)
	}
	const lease = 2 * time.Second
	run := claim.Run{Job: "report", At: time.Now().Truncate(time.Hour).Add(-time.Hour)}
	ran := make(chan job.Run, 1)
	newRunner := func(instance string, controls claim.Controls, h job.Handler) *runner.Runner {
		r, err := runner.New(runner.Options{Claimer: memory.New(store, instance), Instance: instance, Lease: lease,
			Controls: control.New(controls, nil)},
			[]runner.Job{{Name: "report", Schedule: sched, Overlap: runner.OverlapForbid, Handler: h}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	fleet := newRunner("r1", fleetControls, func(ctx context.Context, r job.Run) error {
		if r.ScheduledAt.Equal(run.At) {
			ran <- r
			return nil
		}
		select {
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- fleet.Run(ctx) }()
	time.Sleep(10 * time.Second) // scheduled runs overlap the backfill from now on

	started := make(chan struct{}, 1)
	bf := newRunner("cli", store.Controls(), func(ctx context.Context, r job.Run) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	before()
	bctx, stop := context.WithCancel(ctx)
	sums := make(chan runner.BackfillSummary, 1)
	go func() {
		_, sum, _ := bf.Backfill(bctx, "report", runner.BackfillOptions{From: run.At, To: run.At})
		sums <- sum
	}()
	<-started
	stop()
	if sum := <-sums; sum.Interrupted != 1 {
		t.Fatalf("stopped backfill: %+v, want its run handed back", sum)
	}
	return run, ran, done
}

// The register's entry of a backfill's bid that was never granted (the
// run was the fleet's, held by a replica that then died) does not make
// the fleet's takeover run beside live runs: the run is the fleet's, under
// its policy, and a forbid job's takeover next to a live run is skipped.
// It ran beside the live run before (found by an outside code review):
// two runs of a forbid job at once.
func TestABackfillsBidNeverGrantedLeavesTheRunToThePolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ran, st := takeOverBesideALiveRun(t, control.Unwatched{Holder: "cli", Alongside: true})
		if ran != nil || st != claim.Skipped {
			t.Errorf("the run ended %s (ran: %v), want skipped for overlap, as the forbid policy asks of a takeover beside a live run", st, ran != nil)
		}
	})
}

// A backfill run again, bidding for a run the first backfill was granted
// (and started beside live runs), leaves the first one's entry as it was:
// a replica that never saw it before takes the run over beside the live
// run, as the first backfill ran it. The bid used to overwrite it, and the
// replica skipped the run for good (explorer seed 7202).
func TestASecondBackfillsBidLeavesTheFirstOnesGrantSeen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ran, st := takeOverBesideALiveRun(t, control.Unwatched{Holder: "cli", Alongside: true, Granted: true},
			control.Unwatched{Holder: "cli-again", Alongside: true})
		if ran == nil || ran.Attempt != 2 || st != claim.Succeeded {
			t.Errorf("the run ended %s (ran: %v), want taken over beside the live run and succeeded", st, ran != nil)
		}
	})
}

// takeOverBesideALiveRun has a replica take over, beside a live later run
// of its forbid job, a run an hour old that a replica of the fleet held
// and died with, and which the register names with entries (their Job,
// At and Since are filled in). It returns the takeover's execution, if
// any, and the run's status after.
//
// A fleet of the past ran 20 instants of the job after the run's, so the
// sweep (a job's 16 newest records) does not reach the run: only the
// register leads to it. The replica stands by while nothing else is
// live; the dead holder's lease lapses once a scheduled run has started.
func takeOverBesideALiveRun(t *testing.T, entries ...control.Unwatched) (*job.Run, claim.Status) {
	sched, err := schedule.Parse("30 * * * * *", "")
	if err != nil {
		t.Fatal(err)
	}
	const lease = 2 * time.Second
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	store := memory.NewStore(time.Now)
	controls := control.New(store.Controls(), nil)
	run := claim.Run{Job: "report", At: time.Now().Truncate(time.Hour).Add(-time.Hour)}
	past := memory.New(store, "past")
	for i := range 20 {
		cl, err := claim.ClaimOne(ctx, past, claim.Run{Job: run.Job, At: time.Now().Add(time.Duration(i-20) * time.Minute)}, lease)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.ReleaseOne(ctx, past, cl, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
	}
	ran := make(chan job.Run, 1)
	handler := func(ctx context.Context, r job.Run) error {
		if r.ScheduledAt.Equal(run.At) {
			ran <- r
			return nil
		}
		select { // the scheduled run at :30 lasts 50s
		case <-time.After(50 * time.Second):
		case <-ctx.Done():
		}
		return nil
	}
	fleet, err := runner.New(runner.Options{Claimer: memory.New(store, "r1"), Instance: "r1", Lease: lease, Controls: controls},
		[]runner.Job{{Name: "report", Schedule: sched, Overlap: runner.OverlapForbid, Handler: handler}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fleet.Run(ctx) }()
	// Once the scheduled run at :30 is live, the run is granted, for
	// 10s, to a replica of the fleet that then dies; the entries name it.
	time.Sleep(35 * time.Second)
	if _, err := claim.ClaimOne(ctx, memory.New(store, "dead"), run, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, u := range entries {
		u.Job, u.At, u.Since = run.Job, run.At, time.Now()
		if err := controls.Carry(ctx, u, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	var got *job.Run
	deadline := time.After(2 * time.Minute)
	for st := claim.Running; st == claim.Running && got == nil; st = statusOf(t, ctx, store, run) {
		select {
		case r := <-ran:
			got = &r
		case <-deadline:
			t.Fatalf("the fleet never settled the run the dead replica held; it is %s", st)
		case <-time.After(time.Second):
		}
	}
	synctest.Wait()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return got, statusOf(t, context.Background(), store, run)
}

// downControls is a register whose reads fail while down is set.
type downControls struct {
	claim.Controls
	down *atomic.Bool
}

func (c downControls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	if c.down.Load() {
		return nil, fmt.Errorf("register read: %w", claim.ErrUnavailable)
	}
	return c.Controls.List(ctx, prefix)
}

// A replica that cannot read the register when it takes over a stopped
// backfill's run cannot tell that the run executes beside live runs: it
// hands the run back to be asked again, rather than skip it for overlap
// for good (the instant never ran: a backfill run again keeps a skipped
// instant). Found by an outside code review. The register comes back
// after 5s; the run then runs.
func TestATakeoverThatCannotReadTheRegisterHandsABackfillsRunBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store := memory.NewStore(time.Now)
		var down atomic.Bool
		run, ran, done := backfillStoppedBesideLiveRuns(t, ctx, store, downControls{store.Controls(), &down},
			func() { down.Store(true) }) // the fleet's replica has not read the backfill's entry
		// Back before the backfill's entry expires (unwatchedTTL): the
		// replica then reads it and runs the run.
		up, deadline := time.After(5*time.Second), time.After(2*time.Minute)
		for {
			select {
			case r := <-ran: // in a gap between live runs, or beside them once the register is back
				if r.Attempt < 2 {
					t.Errorf("the backfill's run ran as attempt %d, want a takeover", r.Attempt)
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				return
			case <-up:
				down.Store(false)
			case <-time.After(time.Second):
				if st := statusOf(t, ctx, store, run); st == claim.Skipped {
					t.Fatalf("the backfill's run was skipped for good (register down: %v)", down.Load())
				}
			case <-deadline:
				t.Fatalf("the backfill's run never ran; it is %s", statusOf(t, ctx, store, run))
			}
		}
	})
}

// claimsOf counts the claims of one run a claimer is asked for.
type claimsOf struct {
	claim.Claimer
	run claim.Run
	n   *atomic.Int64
}

func (c claimsOf) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	for _, r := range runs {
		if r.ID() == c.run.ID() {
			c.n.Add(1)
		}
	}
	return c.Claimer.Claim(ctx, runs, lease)
}

// A register entry of a bid that lost (its run went to another process,
// which finished it) lives on for minutes after its bidder left. A
// replica stands by for its run once, hears it done, and stands by no
// more: it used to claim it again at every tick for as long as the entry
// lived (an outside review saw a database's transactions grow twelvefold,
// and a fence burnt per claim, after two backfills' lost bids).
func TestARegisterEntryOfADoneRunIsStoodByForOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store := memory.NewStore(time.Now)
		controls := control.New(store.Controls(), nil)
		run := claim.Run{Job: "report", At: time.Now().Truncate(time.Hour).Add(-time.Hour)}
		cl, err := claim.ClaimOne(ctx, memory.New(store, "winner"), run, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.ReleaseOne(ctx, memory.New(store, "winner"), cl, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
		// The loser's bid, long enough ago to be stood by for at once.
		if err := controls.Carry(ctx, control.Unwatched{Job: run.Job, At: run.At, Holder: "loser", Since: time.Now().Add(-time.Minute)},
			time.Hour); err != nil {
			t.Fatal(err)
		}
		var n atomic.Int64
		r, err := runner.New(runner.Options{Claimer: claimsOf{memory.New(store, "r1"), run, &n}, Instance: "r1", Lease: 2 * time.Second,
			Controls: controls}, []runner.Job{{Name: "report", Schedule: mustSchedule(t, "0 0 0 1 1 *"),
			Handler: func(context.Context, job.Run) error { return nil }}})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		time.Sleep(time.Minute) // sixty ticks of the register
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := n.Load(); got != 1 {
			t.Fatalf("the done run was claimed %d times in a minute, want once", got)
		}
	})
}
