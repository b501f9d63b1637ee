package redlock_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// TestRollingRestartKeepsALiveClaim restarts the nodes empty one at a time,
// never more than one down, while a claim lives: its holder renews it at
// lease/3 and a contender claims the run all along. In a rolling restart
// with a lease and a half between nodes, the holder keeps its claim (its
// renewals give each restarted node the claim back) and the contender is
// never granted the run; other runs of the job get growing fences. Then
// two nodes restart back to back while the holder is paused, so that a
// majority lost the claim before a renewal could give it back: the
// restarted nodes abstain for a lease, so the contender is still not
// granted the run while the paused holder may trust its lease.
func TestRollingRestartKeepsALiveClaim(t *testing.T) {
	testenv.WallClock(t)
	nodes, addrs := startNodes(t, 3)
	ns := prepare(t, addrs)
	holder, contender := ns.Open("holder"), ns.Open("contender")
	const lease = 2 * time.Second
	run := runAt("job.rolling", 0)
	held, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu      sync.Mutex
		trusted = held.TrustedUntil(0) // the holder's trust window, as the runner keeps it
		lost    error                  // the first renewal refused
		paused  atomic.Bool
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	wg.Go(func() { // the holder's keep-alive
		for {
			select {
			case <-stop:
				return
			case <-time.After(lease / 3): // the renewal cadence under test
			}
			if paused.Load() {
				continue
			}
			err := holder.Renew(ctxT(t), held, lease)
			mu.Lock()
			switch {
			case err == nil:
				trusted = held.TrustedUntil(0)
			case errors.Is(err, claim.ErrLeaseLost) && lost == nil:
				lost = err
			}
			mu.Unlock()
		}
	})
	var won atomic.Bool
	wg.Go(func() { // the contender, standing by for the run
		for !won.Load() {
			select {
			case <-stop:
				return
			default:
			}
			cl, err := claim.ClaimOne(ctxT(t), contender, run, lease)
			if err != nil {
				time.Sleep(20 * time.Millisecond) // standing by, as the runner does
				continue
			}
			won.Store(true)
			mu.Lock()
			left := time.Until(trusted)
			mu.Unlock()
			if left > 0 {
				t.Errorf("contender granted %s (fence %d) while the holder still trusts its claim for %v", run.ID(), cl.Fence, left)
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()

	last := held.Fence
	for i, n := range nodes {
		n.Restart()
		cl := takeOver(t, contender, runAt("job.rolling", i+1), lease)
		if cl.Fence <= last {
			t.Fatalf("fence %d after node %d restarted, want above %d", cl.Fence, i, last)
		}
		last = cl.Fence
		time.Sleep(lease * 3 / 2) // the restarted node's abstention ends before the next restart: the worst case
	}
	mu.Lock()
	if lost != nil || won.Load() {
		t.Fatalf("rolling restart: holder's renewal refused (%v), contender won: %v; want the holder to keep its claim", lost, won.Load())
	}
	mu.Unlock()

	paused.Store(true)
	nodes[0].Restart()
	nodes[1].Restart()
	time.Sleep(lease * 3 / 2) // the contender bids throughout the paused holder's trust window
	paused.Store(false)
}
