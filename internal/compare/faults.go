package compare

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/history"
)

// Fault names. A scenario is one name or several joined by "+" (pause+skew);
// each scenario is run as its own cell for every claimer.
const (
	FaultNone            = "none"             // baseline: healthy replicas
	FaultPause           = "pause"            // the holder of a billing run freezes (handler and keep-alive) for 2.5 leases
	FaultCrash           = "crash"            // the holder of a long run dies mid-run: no release, no renewal
	FaultSkew            = "skew"             // replica clocks offset within ±max_clock_skew/2
	FaultSkewBeyond      = "skew-beyond"      // replica clocks offset by 1–2×max_clock_skew, alternating sign
	FaultLatency         = "latency"          // every replica's links delayed 1–10ms each way (seeded per replica)
	FaultReset           = "reset"            // every lease/4–lease/2 one replica's connections are reset
	FaultPartition       = "partition"        // the holder of a billing run is cut off from its backend for 2 leases
	FaultRedisRestart    = "redis-restart"    // a redis-server compare started is killed and restarted empty
	FaultPostgresRestart = "postgres-restart" // a PostgreSQL cluster compare started crashes (immediate shutdown) and restarts
)

// AllFaults lists every fault name, in report order.
var AllFaults = []string{FaultNone, FaultPause, FaultCrash, FaultSkew, FaultSkewBeyond,
	FaultLatency, FaultReset, FaultPartition, FaultRedisRestart, FaultPostgresRestart}

// networkFaults need a TCP link between replica and backend (a faultproxy).
var networkFaults = []string{FaultLatency, FaultReset, FaultPartition}

// ParseScenarios splits a --faults value: scenarios separated by commas,
// faults within a scenario by "+". It rejects unknown names, duplicates and
// combinations that contradict each other.
func ParseScenarios(s string) ([]string, error) {
	var out []string
	for _, sc := range strings.Split(s, ",") {
		sc = strings.TrimSpace(sc)
		if sc == "" {
			continue
		}
		parts := strings.Split(sc, "+")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		if sc == FaultRandom {
			if slices.Contains(out, sc) {
				return nil, fmt.Errorf("scenario %q listed twice", sc)
			}
			out = append(out, sc)
			continue
		}
		for i, f := range parts {
			f = strings.TrimSpace(f)
			parts[i] = f
			if f == FaultRandom {
				return nil, fmt.Errorf("%q: random composes faults itself and cannot be combined", sc)
			}
			if !slices.Contains(AllFaults, f) {
				return nil, fmt.Errorf("unknown fault %q (want one of %s, or random)", f, strings.Join(AllFaults, ", "))
			}
			if slices.Index(parts, f) != i {
				return nil, fmt.Errorf("fault %q listed twice in %q", f, sc)
			}
		}
		if len(parts) > 1 && slices.Contains(parts, FaultNone) {
			return nil, fmt.Errorf("%q: none cannot be combined", sc)
		}
		if slices.Contains(parts, FaultSkew) && slices.Contains(parts, FaultSkewBeyond) {
			return nil, fmt.Errorf("%q: skew and skew-beyond contradict each other", sc)
		}
		sc = strings.Join(parts, "+")
		if slices.Contains(out, sc) {
			return nil, fmt.Errorf("scenario %q listed twice", sc)
		}
		out = append(out, sc)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no fault scenario given")
	}
	return out, nil
}

// faultSet is one scenario's faults.
type faultSet []string

func (f faultSet) has(name string) bool { return slices.Contains(f, name) }

func (f faultSet) network() bool {
	return slices.ContainsFunc(f, func(n string) bool { return slices.Contains(networkFaults, n) })
}

// replica is one in-process replica: its claimer, its clock and the state
// the faults act on. A frozen replica (pause) blocks its handlers and every
// claimer call, keep-alive included, as a stop-the-world GC pause would; a
// crashed one does nothing any more.
type replica struct {
	id      string
	c       *cell
	claimer claim.Claimer // the real one wrapped in faulty
	offset  time.Duration // clock skew
	links   []link        // faultproxies between this replica and its backend

	mu      sync.Mutex
	frozen  chan struct{} // non-nil while paused; closed when the pause ends
	crashed atomic.Bool
	dead    chan struct{} // closed on crash
	cancel  context.CancelFunc
}

// now is the replica's wall clock, as the runner sees it.
func (r *replica) now() time.Time { return time.Now().Add(r.offset) }

// gate blocks while the replica is frozen. It ignores every context on
// purpose: a paused process does not notice deadlines either. It returns
// early only when the replica crashes or the cell ends.
func (r *replica) gate() {
	r.mu.Lock()
	ch := r.frozen
	r.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-r.dead:
	case <-r.c.stop:
	}
}

// freeze pauses the replica for d. The cell's wait group owns the timer
// goroutine that thaws it.
func (r *replica) freeze(d time.Duration) {
	ch := make(chan struct{})
	r.mu.Lock()
	if r.frozen != nil {
		r.mu.Unlock()
		return
	}
	r.frozen = ch
	r.mu.Unlock()
	r.c.wg.Go(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.c.stop:
		}
		r.mu.Lock()
		r.frozen = nil
		r.mu.Unlock()
		close(ch)
	})
}

// crash kills the replica: its runner is cancelled, and from now on every
// claimer call fails without reaching the backend, so nothing is released
// or renewed, and its handlers return at their next step without writing.
func (r *replica) crash() {
	if r.crashed.Swap(true) {
		return
	}
	close(r.dead)
	r.c.rec.log.Add(history.Event{Kind: history.Crash, Replica: r.id})
	r.cancel()
}

var errCrashed = fmt.Errorf("%w: replica crashed (simulated)", claim.ErrLeaseLost)

// faulty wraps a replica's real claimer: it applies the replica's faults
// and records every call (latency, grants, renewals, releases) in the
// cell's recorder and, for the history checker, in its history.Log.
type faulty struct {
	inner claim.Claimer
	rep   *replica
	rec   *recorder
}

var (
	_ claim.TakeoverHolder = (*faulty)(nil)
	_ claim.LossWatcher    = (*faulty)(nil)
)

// TakeoversHeld implements claim.TakeoverHolder with the real claimer's
// hold, and WatchLoss claim.LossWatcher with its watch, so that the
// runner over the wrapper does what it does over the claimer in
// production: it says when takeovers are held and waits the hold out in
// its overlap probe, and it warns of a data loss no claim met.
func (f *faulty) TakeoversHeld(lease time.Duration) bool { return claim.HeldBy(f.inner, lease) }

// WatchLoss implements claim.LossWatcher (see TakeoversHeld).
func (f *faulty) WatchLoss(report func(*claim.DataLossError)) { claim.WatchLossOf(f.inner, report) }

// Claim is one call, faulted as a whole, whatever the batch holds.
func (f *faulty) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	f.rep.gate()
	if f.rep.crashed.Load() {
		return claim.EachRun(runs, func(claim.Run) (*claim.Claim, error) {
			return nil, fmt.Errorf("%w: replica crashed (simulated)", claim.ErrUnavailable)
		})
	}
	start := time.Now()
	cls, errs := f.inner.Claim(ctx, runs, lease)
	f.rec.claimed(f.rep.id, runs, start, time.Now(), cls, errs)
	f.rec.log.Claimed(f.rep.id, start, runs, lease, cls, errs)
	return cls, errs
}

func (f *faulty) Renew(ctx context.Context, c *claim.Claim, lease time.Duration) error {
	f.rep.gate()
	if f.rep.crashed.Load() {
		return errCrashed
	}
	err := f.inner.Renew(ctx, c, lease)
	f.rec.renewed(c, err)
	if err == nil {
		f.rec.log.Renewed(f.rep.id, c)
	}
	return err
}

// Release is one call, faulted as a whole.
func (f *faulty) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	f.rep.gate()
	if f.rep.crashed.Load() {
		return claim.EachClaim(cls, outs, func(*claim.Claim, claim.Status) error { return errCrashed })
	}
	sent := time.Now()
	errs := f.inner.Release(ctx, cls, outs)
	f.rec.released(cls, outs, sent, errs)
	f.rec.log.Released(f.rep.id, sent, cls, outs, errs)
	return errs
}

func (f *faulty) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	f.rec.call()
	return f.inner.History(ctx, job, limit)
}

func (f *faulty) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	f.rec.call()
	return claim.Histories(ctx, f.inner, qs)
}

func (f *faulty) Ping(ctx context.Context) error {
	f.rec.call()
	return f.inner.Ping(ctx)
}

func (f *faulty) Close() error { return f.inner.Close() }

// wrap puts a replica's faults around its claimer.
func wrap(inner claim.Claimer, rep *replica, rec *recorder) claim.Claimer {
	return &faulty{inner: inner, rep: rep, rec: rec}
}
