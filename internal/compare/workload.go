package compare

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

// Job kinds of the generated workload.
const (
	kindTick    = "tick"    // every second; one fenced write, ~10ms of work
	kindLong    = "long"    // outlives its lease (1.5 leases): only renewal keeps it
	kindBilling = "billing" // every 2s; three fenced writes 20ms apart, like invoices
)

// billingWrites is how many fenced writes a billing run makes.
const billingWrites = 3

type workJob struct {
	name  string
	kind  string
	spec  string
	sched *schedule.Schedule
}

// workload is the generated job mix, the same on every replica.
type workload struct {
	jobs       []workJob
	longRun    time.Duration // how long a long run works
	longPeriod time.Duration
	counts     map[string]int
}

// newWorkload builds n jobs: a fifth billing-like, a fifth long, the rest
// per-second ticks; at least one of each.
func newWorkload(n int, lease time.Duration) (*workload, error) {
	w := &workload{longRun: lease * 3 / 2, counts: map[string]int{}}
	w.longPeriod = time.Duration(max(2, int(math.Ceil((2*lease).Seconds())))) * time.Second
	billing, long := max(1, n/5), max(1, n/5)
	kinds := map[string]int{kindBilling: billing, kindLong: long, kindTick: n - billing - long}
	specs := map[string]string{kindTick: "* * * * * *", kindLong: fmt.Sprintf("@every %s", w.longPeriod),
		kindBilling: "@every 2s"}
	for _, kind := range []string{kindTick, kindLong, kindBilling} {
		for i := range kinds[kind] {
			s, err := schedule.Parse(specs[kind], "UTC")
			if err != nil {
				return nil, err
			}
			w.jobs = append(w.jobs, workJob{name: fmt.Sprintf("%s.%02d", kind, i+1), kind: kind, spec: specs[kind], sched: s})
			w.counts[kind]++
		}
	}
	return w, nil
}

// runnerJobs binds the workload's handlers to one replica. Overlap is
// allowed so that every instant is a run of its own that must execute: a
// takeover is never skipped because the next instant came.
func (c *cell) runnerJobs(rep *replica) []runner.Job {
	var out []runner.Job
	for _, j := range c.work.jobs {
		h := c.handler(rep, j.kind)
		handler := func(ctx context.Context, run job.Run) error {
			err := h(ctx, run)
			if err == nil {
				c.rec.completed(rep.id, run.ID)
			}
			return err
		}
		out = append(out, runner.Job{Name: j.name, Schedule: j.sched, Handler: handler,
			Overlap: runner.OverlapAllow, MaxAttempts: 5, Misfire: runner.MisfireRunOnce, Grace: time.Minute})
	}
	return out
}

func (c *cell) handler(rep *replica, kind string) job.Handler {
	switch kind {
	case kindLong:
		return func(ctx context.Context, run job.Run) error {
			c.longStarted(rep)
			if err := c.write(ctx, rep, run, 0); err != nil {
				return err
			}
			if err := c.busy(ctx, rep, c.work.longRun); err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return context.Cause(ctx)
			}
			return c.write(ctx, rep, run, 1)
		}
	case kindBilling:
		return func(ctx context.Context, run job.Run) error {
			for k := range billingWrites {
				// The write after a pause happens before the handler looks at
				// its context, as a write already under way when the process
				// froze would: only the fence can stop it.
				rep.gate()
				if err := c.write(ctx, rep, run, k); err != nil {
					return err
				}
				if k == 0 {
					c.billingWrote(rep)
				}
				if k < billingWrites-1 {
					if err := c.busy(ctx, rep, 20*time.Millisecond); err != nil {
						return err
					}
				}
			}
			return nil
		}
	default:
		return func(ctx context.Context, run job.Run) error {
			rep.gate()
			if err := c.write(ctx, rep, run, 0); err != nil {
				return err
			}
			return c.busy(ctx, rep, 10*time.Millisecond)
		}
	}
}

// busy works for d of wall time, stopping early when ctx is done or the
// replica crashes, and standing still while it is frozen.
func (c *cell) busy(ctx context.Context, rep *replica, d time.Duration) error {
	end := time.Now().Add(d)
	for {
		rep.gate()
		if rep.crashed.Load() {
			return errCrashed
		}
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		t := time.NewTimer(min(left, 100*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

var errStale = errors.New("fenced write rejected: a newer holder wrote first")

// write makes the run's k-th fenced write. A rejected write means this
// holder lost its claim: it waits (bounded) for the runner to cancel it
// with ErrLeaseLost, counts whether it did, and fails.
func (c *cell) write(ctx context.Context, rep *replica, run job.Run, k int) error {
	if rep.crashed.Load() {
		return errCrashed // a dead process writes nothing
	}
	seq := 0
	if g := c.rec.grantOf(rep.id, run.ID); g != nil {
		seq = g.seq
	}
	res := fmt.Sprintf("%s/%d", run.ID, k)
	if c.store.write(res, run.Fence, seq) {
		return nil
	}
	t := time.NewTimer(2 * c.lease)
	defer t.Stop()
	select {
	case <-ctx.Done():
		cause := context.Cause(ctx)
		if errors.Is(cause, claim.ErrLeaseLost) {
			c.rec.sawLeaseLost()
		}
		return fmt.Errorf("%w (fence %d): %w", errStale, run.Fence, cause)
	case <-t.C:
	case <-c.stop:
	}
	return fmt.Errorf("%w (fence %d)", errStale, run.Fence)
}

// fencedStore is the billing-like storage every handler writes to: per
// resource it keeps the highest fence written and rejects lower ones. It
// also knows, from the harness, the order in which holders were granted,
// so it can tell when fencing failed: a write accepted after a newer
// holder of the same resource had already written.
type fencedStore struct {
	mu       sync.Mutex
	res      map[string]*fenced
	writes   int
	rejected int
	accepted int // stale writes accepted: must stay 0
	staleIDs []string
}

type fenced struct {
	fence  int64
	newest int // highest grant sequence number that wrote
}

func newFencedStore() *fencedStore { return &fencedStore{res: map[string]*fenced{}} }

// write stores fence on res unless a higher fence is there; seq orders the
// writer's grant among all grants the harness saw.
func (s *fencedStore) write(res string, fence int64, seq int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	r := s.res[res]
	if r == nil {
		s.res[res] = &fenced{fence: fence, newest: seq}
		return true
	}
	if fence < r.fence {
		s.rejected++
		return false
	}
	if r.newest > seq {
		s.accepted++
		if len(s.staleIDs) < maxListed {
			s.staleIDs = append(s.staleIDs, res)
		}
	}
	r.fence, r.newest = fence, max(r.newest, seq)
	return true
}
