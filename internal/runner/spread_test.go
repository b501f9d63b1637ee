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

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// slowClaims makes every claim batch take a little (fake) time and records
// how many are in flight at once.
type slowClaims struct {
	claim.Claimer
	inFlight, most *atomic.Int32
	delay          time.Duration
}

func (s slowClaims) Claim(ctx context.Context, runs []claim.Run, l time.Duration) ([]*claim.Claim, []error) {
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	time.Sleep(s.delay)
	return s.Claimer.Claim(ctx, runs, l)
}

// shareOut runs jobs jobs, all due at the same instants, on three replicas
// whose clocks run 0, 1 and 2 late steps behind, with claims that take
// claimDelay, and returns how many runs each replica started.
func shareOut(t *testing.T, jobs int, opts runner.Options, lateStep, claimDelay time.Duration) (shares []int, led *ledger, most int32) {
	store := memory.NewStore(nil)
	led = newLedger()
	var inFlight, peak atomic.Int32
	var list []runner.Job
	for i := range jobs {
		list = append(list, runner.Job{Name: fmt.Sprintf("j%03d", i), Schedule: mustSchedule(t, "@every 10s"),
			Handler: func(context.Context, job.Run) error { return nil }})
	}
	var mu sync.Mutex
	shares = make([]int, 3)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range shares {
		o := opts
		name := fmt.Sprintf("r%d", i)
		o.Claimer = led.claimer(name, slowClaims{Claimer: memory.New(store, name), inFlight: &inFlight, most: &peak, delay: claimDelay})
		o.Instance, o.ClaimerName, o.Lease = name, "memory", 3*time.Second
		late := time.Duration(i) * lateStep
		o.Now = func() time.Time { return time.Now().Add(-late) }
		observe := led.observer(name)
		o.Observe = func(e runner.Event) {
			observe(e)
			if e.Kind == runner.EventStarted {
				mu.Lock()
				shares[i]++
				mu.Unlock()
			}
		}
		r, err := runner.New(o, list)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	time.Sleep(35 * time.Second) // three instants
	cancel()
	wg.Wait()
	led.check(t, history.Spec{Forbid: forbidAll(list)})
	return shares, led, peak.Load()
}

func TestSpreadSharesRunsDueAtOneInstantAmongReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shares, led, _ := shareOut(t, 100, runner.Options{}, time.Millisecond, 0)
		total := 0
		for _, n := range shares {
			total += n
		}
		if total < 300 {
			t.Fatalf("%d runs started, want 100 jobs × 3 instants or more", total)
		}
		for id, s := range led.started() {
			if len(s) != 1 {
				t.Fatalf("run %s started %d times", id, len(s))
			}
		}
		if lo, hi := slices.Min(shares), slices.Max(shares); float64(hi) > 1.5*float64(lo) {
			t.Fatalf("shares %v: max/min %.2f, want ≤ 1.5", shares, float64(hi)/float64(max(lo, 1)))
		}
		// Without it, the replica that wakes first wins nearly everything.
		if shares, _, _ := shareOut(t, 100, runner.Options{Spread: -1}, time.Millisecond, 0); slices.Min(shares)*5 > slices.Max(shares) {
			t.Fatalf("without Spread shares are %v: the case proves nothing", shares)
		}
	})
}

// TestOneClaimBatchInFlightPerReplica: when many runs fall due at once,
// a replica sends one claim batch at a time (the rest wait for the next,
// group commit) instead of putting every bid in flight, where they would
// queue for a connection inside their claim timeout.
func TestOneClaimBatchInFlightPerReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shares, _, most := shareOut(t, 50, runner.Options{Spread: -1}, 0, time.Millisecond)
		if total := shares[0] + shares[1] + shares[2]; total < 150 {
			t.Fatalf("%d runs started, want 50 jobs × 3 instants or more", total)
		}
		if most > 3 {
			t.Fatalf("%d claim batches in flight at once on 3 replicas, want at most one each", most)
		}
	})
}

// batchMemory counts the claim batches it is sent, and makes each take one
// (fake) round trip.
type batchMemory struct {
	claim.Claimer
	batches, runs, biggest *atomic.Int32
}

func (b batchMemory) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	b.batches.Add(1)
	b.runs.Add(int32(len(runs)))
	for m := b.biggest.Load(); int32(len(runs)) > m && !b.biggest.CompareAndSwap(m, int32(len(runs))); m = b.biggest.Load() {
	}
	time.Sleep(time.Millisecond) // one round trip
	return b.Claimer.Claim(ctx, runs, lease)
}

// runInstants runs 3 replicas, without spread, on the claimers open
// gives, for 25 fake seconds, and checks that list's 200 jobs (every 10s)
// started at least two instants each.
func runInstants(t *testing.T, led *ledger, list []runner.Job, open func(i int) claim.Claimer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 3 {
		name := fmt.Sprintf("r%d", i)
		r, err := runner.New(runner.Options{Claimer: led.claimer(name, open(i)), ClaimerName: "memory", Instance: name,
			Lease: 3 * time.Second, Spread: -1, Observe: led.observer(name)}, list)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	time.Sleep(25 * time.Second)
	cancel()
	wg.Wait()
	if n := len(led.started()); n < 400 {
		t.Fatalf("%d runs started, want 200 jobs × 2 instants or more", n)
	}
	led.check(t, history.Spec{Forbid: forbidAll(list)})
}

// forbidAll lists jobs whose runs must not overlap: every job of list, all
// of them overlap: forbid (the default).
func forbidAll(list []runner.Job) map[string]bool {
	forbid := map[string]bool{}
	for _, j := range list {
		forbid[j.Name] = true
	}
	return forbid
}

func TestBatchClaimerGetsRunsDueAtOneInstantInFewBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		var batches, bids, biggest atomic.Int32
		var list []runner.Job
		for i := range 200 {
			list = append(list, runner.Job{Name: fmt.Sprintf("j%03d", i), Schedule: mustSchedule(t, "@every 10s"),
				Handler: func(context.Context, job.Run) error { return nil }})
		}
		// No spread: holds would space the bids out over 100ms.
		runInstants(t, led, list, func(i int) claim.Claimer {
			return batchMemory{Claimer: memory.New(store, fmt.Sprintf("r%d", i)), batches: &batches, runs: &bids, biggest: &biggest}
		})
		for id, s := range led.started() {
			if len(s) != 1 {
				t.Fatalf("run %s started %d times", id, len(s))
			}
		}
		// The bids of one instant go out together; a loser's later re-bids,
		// jittered, mostly alone.
		if m := biggest.Load(); m < 50 {
			t.Fatalf("%d bids went out in %d batches of at most %d: not coalesced", bids.Load(), batches.Load(), m)
		}
	})
}

// releasingMemory is batchMemory that also counts release batches.
type releasingMemory struct {
	batchMemory
	releaseBatches, released, biggestRelease *atomic.Int32
}

func (b releasingMemory) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	b.releaseBatches.Add(1)
	for m := b.biggestRelease.Load(); int32(len(cls)) > m && !b.biggestRelease.CompareAndSwap(m, int32(len(cls))); m = b.biggestRelease.Load() {
	}
	time.Sleep(time.Millisecond) // one round trip
	errs := b.Claimer.Release(ctx, cls, outs)
	for _, err := range errs {
		if err == nil {
			b.released.Add(1)
		}
	}
	return errs
}

func TestBatchReleaserEndsRunsFinishingTogetherInFewBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		var batches, bids, biggest, releaseBatches, released, biggestRelease atomic.Int32
		var list []runner.Job
		for i := range 200 {
			list = append(list, runner.Job{Name: fmt.Sprintf("j%03d", i), Schedule: mustSchedule(t, "@every 10s"),
				// Every run ends at the same fake instant.
				Handler: func(ctx context.Context, _ job.Run) error {
					time.Sleep(time.Until(time.Now().Truncate(10 * time.Second).Add(2 * time.Second)))
					return nil
				}})
		}
		runInstants(t, led, list, func(i int) claim.Claimer {
			return releasingMemory{
				batchMemory:    batchMemory{Claimer: memory.New(store, fmt.Sprintf("r%d", i)), batches: &batches, runs: &bids, biggest: &biggest},
				releaseBatches: &releaseBatches, released: &released, biggestRelease: &biggestRelease}
		})
		probe := memory.New(store, "probe")
		started := led.started()
		for id, s := range started {
			if len(s) != 1 {
				t.Fatalf("run %s started %d times", id, len(s))
			}
			if f := led.finishes(id); len(f) != 1 || f[0].Status != claim.Succeeded {
				t.Fatalf("run %s finished %v, want once, succeeded", id, f)
			}
			if _, err := claim.ClaimOne(t.Context(), probe, s[0].Run, time.Second); !errors.Is(err, claim.ErrDone) {
				t.Fatalf("run %s after its release: %v, want done", id, err)
			}
		}
		if got, want := int(released.Load()), len(started); got != want {
			t.Fatalf("%d claims released, want one per run started (%d)", got, want)
		}
		if m := biggestRelease.Load(); m < 50 {
			t.Fatalf("%d releases went out in %d batches of at most %d: not coalesced", released.Load(), releaseBatches.Load(), m)
		}
		t.Logf("%d releases in %d batches (largest %d)", released.Load(), releaseBatches.Load(), biggestRelease.Load())
	})
}

// TestReplicasBidFirstForTheRunsTheyHoldLeast: where thousands of runs
// fall due at once, a replica reaches its bids after its holds have
// passed, so the order it bids in decides what it wins. Each replica bids
// first for the runs it holds least; most of the first third of its bids
// are runs it would win on time (its hold the shortest of the three), and
// the three first thirds barely overlap, where the dispatch order (the
// same on every replica) gives a third and full overlap.
func TestReplicasBidFirstForTheRunsTheyHoldLeast(t *testing.T) {
	const n, spread = 3000, time.Second
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	runs := make([]claim.Run, n)
	for i := range runs {
		runs[i] = claim.Run{Job: fmt.Sprintf("job.%04d", i), At: at}
	}
	instances := []string{"replica-a", "replica-b", "replica-c"}
	preferredBy := func(run claim.Run) string { // the replica with the shortest hold
		best := ""
		for _, in := range instances {
			if best == "" || runner.HoldFor(run.ID(), in, spread) < runner.HoldFor(run.ID(), best, spread) {
				best = in
			}
		}
		return best
	}
	firsts := map[string]int{} // run → how many replicas bid for it in their first third
	for _, in := range instances {
		order := runner.BidOrder(in, slices.Clone(runs), spread)
		if len(order) != n {
			t.Fatalf("%s bids for %d runs, want %d", in, len(order), n)
		}
		own := 0
		for k, run := range order[:n/3] {
			if k > 0 && runner.HoldFor(run.ID(), in, spread) < runner.HoldFor(order[k-1].ID(), in, spread) {
				t.Fatalf("%s bids for %s (hold %v) after %s (hold %v)", in, run.ID(), runner.HoldFor(run.ID(), in, spread),
					order[k-1].ID(), runner.HoldFor(order[k-1].ID(), in, spread))
			}
			if preferredBy(run) == in {
				own++
			}
			firsts[run.ID()]++
		}
		if share := float64(own) / (n / 3); share < 0.6 {
			t.Errorf("%s: %.0f%% of its first %d bids are runs it holds least, want ≥ 60%%", in, 100*share, n/3)
		}
	}
	if len(firsts) < n*2/3 {
		t.Errorf("the replicas' first thirds cover %d distinct runs of %d: they overlap too much", len(firsts), n)
	}
	// The order things are dispatched in, job by job, gives no replica a head start.
	own := 0
	for _, run := range runs[:n/3] {
		if preferredBy(run) == instances[0] {
			own++
		}
	}
	if share := float64(own) / (n / 3); share > 0.45 {
		t.Fatalf("in dispatch order %.0f%% of the first bids are runs replica-a holds least: the case proves nothing", 100*share)
	}
}
