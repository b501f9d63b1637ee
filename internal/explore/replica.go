package explore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/nemesis"
	"github.com/scheduler-dev/scheduler/internal/runner"
)

// replica is one simulated process: a runner over its own faulty view of
// the shared store, restarted after a crash or a termination.
type replica struct {
	w   *world
	idx int
	id  string

	mu  sync.Mutex
	gen int             // incarnation
	ctx context.Context // the incarnation's: ends when it crashes or terminates
	// execs names the operator's processes running on this replica's
	// host (inPod: backfills, triggers): a crash of the replica kills
	// them too.
	execs     map[string]bool
	deadGen   int // incarnations up to this one crashed
	stopped   chan struct{}
	cancel    context.CancelFunc
	downUntil time.Time
	pauseEnd  time.Time
	partEnd   time.Time
	oneWayEnd time.Time
	latEnd    time.Time
	delay     time.Duration
	clockEnd  time.Time
	shift     time.Duration
}

// life runs incarnations of the replica until ctx is done.
func (r *replica) life(ctx context.Context) {
	for ctx.Err() == nil {
		r.mu.Lock()
		r.gen++
		gen := r.gen
		stopped := make(chan struct{})
		r.stopped = stopped
		rctx, cancel := context.WithCancel(ctx)
		r.cancel, r.ctx = cancel, rctx
		r.mu.Unlock()

		inner, err := r.w.cfg.Open(r.id)
		if err != nil {
			r.w.log.Add(history.Event{Kind: history.Fault, Replica: r.id, Note: "cannot open claimer: " + err.Error()})
			if !sleepUntil(ctx, time.Now().Add(r.w.cfg.Lease)) {
				return
			}
			continue
		}
		c := newFaulty(r, gen, inner, r.id)
		run := r.runner(c, func(opts *runner.Options) {
			opts.ShutdownGrace = time.Second
			if r.w.cfg.Controls != nil {
				opts.Controls = control.New(faultyControls{c, r.w.cfg.Controls}, nil)
			}
		})
		exited := make(chan struct{})
		r.w.wg.Go(func() {
			defer close(exited)
			defer inner.Close()
			_ = run.Run(rctx)
		})
		r.w.log.Add(history.Event{Kind: history.Up, Replica: r.id})
		select {
		case <-ctx.Done():
			<-exited
			cancel()
			return
		case <-stopped:
		}
		if !r.dead(gen) {
			<-exited // terminated: it shuts down gracefully
			r.w.log.Add(history.Event{Kind: history.Down, Replica: r.id})
		}
		cancel()
		r.mu.Lock()
		until := r.downUntil
		r.mu.Unlock()
		if !sleepUntil(ctx, until) {
			return
		}
	}
}

// runner builds a runner of incarnation c.gen of r, over c, named c.name
// (the replica's, or a process's in its pod), with the incarnation's
// jobs, clock and observer; tune adds what only some need.
func (r *replica) runner(c *faulty, tune func(*runner.Options)) *runner.Runner {
	gen := c.gen
	opts := runner.Options{Claimer: c, ClaimerName: "memory", Instance: c.name,
		Lease: r.w.cfg.Lease, MaxClockSkew: r.w.cfg.MaxSkew,
		Now: r.now, Observe: r.w.log.Observer(c.name, func() bool { return !c.dead() })}
	if l := r.w.cfg.Log; l != nil {
		opts.Logger = slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})).
			With("replica", c.name, "incarnation", gen)
	}
	if tune != nil {
		tune(&opts)
	}
	run, err := runner.New(opts, r.w.runnerJobs(r, c))
	if err != nil {
		panic(err) // the workload is the harness's own: a bug here is ours
	}
	return run
}

// apply starts op on this replica; until is when it ends.
func (r *replica) apply(op nemesis.Op, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch op.Kind {
	case nemesis.Crash, nemesis.Term:
		r.downUntil = later(r.downUntil, until)
		select {
		case <-r.stopped:
			return // already down
		default:
		}
		if op.Kind == nemesis.Crash {
			r.deadGen = r.gen
			r.w.log.Add(history.Event{Kind: history.Crash, Replica: r.id})
			for name := range r.execs {
				r.w.log.Add(history.Event{Kind: history.Crash, Replica: name})
			}
		}
		close(r.stopped)
		r.cancel()
	case nemesis.Pause:
		r.pauseEnd = later(r.pauseEnd, until)
	case nemesis.Partition:
		r.partEnd = later(r.partEnd, until)
	case nemesis.OneWay:
		r.oneWayEnd = later(r.oneWayEnd, until)
	case nemesis.Latency:
		r.latEnd, r.delay = later(r.latEnd, until), op.Delay
	case nemesis.Clock:
		r.clockEnd, r.shift = until, op.Shift
	}
}

func (r *replica) dead(gen int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return gen <= r.deadGen
}

// gate blocks while the replica is paused, as a stopped process would.
func (r *replica) gate() {
	for {
		r.mu.Lock()
		wait := time.Until(r.pauseEnd)
		r.mu.Unlock()
		if wait <= 0 {
			return
		}
		time.Sleep(wait) // the harness's pause, not a production wait
	}
}

// now is the replica's wall clock: frozen while paused, stepped while a
// clock fault lasts.
func (r *replica) now() time.Time {
	r.gate()
	r.mu.Lock()
	defer r.mu.Unlock()
	t := time.Now()
	if t.Before(r.clockEnd) {
		return t.Add(r.shift)
	}
	return t
}

// ops yields the plan's faults of this replica (and the outages).
func (r *replica) ops(kinds ...string) []nemesis.Op {
	var out []nemesis.Op
	for _, op := range r.w.plan.Ops {
		if (op.Replica == r.idx || op.Replica < 0) && contains(kinds, op.Kind) {
			out = append(out, op)
		}
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func overlaps(t0 time.Time, op nemesis.Op, from, to time.Time) bool {
	end := op.End()
	if op.Kind == nemesis.Restart || op.Kind == nemesis.Rewind {
		// The server takes a while to come back and load (a rewind: to
		// sync from the copy), and its restart guard holds runs a lease.
		end += restartSlack
	}
	return t0.Add(op.At).Before(to) && t0.Add(end).After(from)
}

// restartSlack is how long, past its planned downtime, a restarted server
// counts as unreachable.
const restartSlack = 2 * time.Second

// up reports whether the replica ran (neither crashed nor terminated)
// throughout [from, to].
func (r *replica) up(t0, from, to time.Time) bool {
	for _, op := range r.ops(nemesis.Crash, nemesis.Term) {
		if overlaps(t0, op, from, to) {
			return false
		}
	}
	return true
}

// healthy reports whether the replica could claim and run throughout
// [from, to]: up, reachable, not paused, its clock within the skew.
func (r *replica) healthy(t0, from, to time.Time) bool {
	for _, op := range r.ops(nemesis.Crash, nemesis.Term, nemesis.Pause, nemesis.Partition, nemesis.OneWay, nemesis.Outage, nemesis.Clock, nemesis.Restart, nemesis.Stall, nemesis.Refuse, nemesis.Rewind) {
		if overlaps(t0, op, from, to) {
			return false
		}
	}
	return true
}

// faulty is one incarnation's claimer: the shared store as the faults
// let this replica see it. What reaches the store is logged as a fact,
// whether or not its reply gets back, under name: the replica's id, or a
// backfill's that runs on its host.
type faulty struct {
	r     *replica
	gen   int
	inner claim.Claimer
	name  string
	// killed, for a process in r's pod (inPod), is set when the process
	// alone is killed (kill -9): it dies as a crash of r would kill it.
	killed *atomic.Bool
	// unanswered records the calls the faults left unanswered, as a
	// networked claimer's client does (claim.Unanswered): over the memory
	// store, whose claimer cannot see the faults, the harness holds
	// takeovers back for it (Claim).
	unanswered claim.Unanswered
}

// newFaulty is process name, incarnation gen of r, over inner. Over the
// memory store its hold starts as a networked claimer's does
// (claim.Unanswered.Start): a new process does not know whether the
// backend has just left its predecessors' calls unanswered.
func newFaulty(r *replica, gen int, inner claim.Claimer, name string) *faulty {
	f := &faulty{r: r, gen: gen, inner: inner, name: name}
	f.unanswered.StartAt(time.Now())
	return f
}

// dead reports whether the process behind f crashed or was killed.
func (f *faulty) dead() bool {
	return f.r.dead(f.gen) || f.killed != nil && f.killed.Load()
}

// call applies the replica's faults around apply, which reaches the store
// and returns what its reply would carry: the caller gets it only if the
// reply comes back.
func call[T any](f *faulty, ctx context.Context, apply func(ctx context.Context) (T, error)) (T, error) {
	v, err, answered := reach(f, ctx, apply)
	if answered {
		f.unanswered.AnsweredAt(time.Now())
	} else {
		f.unanswered.NoteAt(time.Now())
	}
	return v, err
}

// reach is call's path through the faults; answered is false when the
// caller got no answer (the backend down, stalled, or cut off).
func reach[T any](f *faulty, ctx context.Context, apply func(ctx context.Context) (T, error)) (_ T, _ error, answered bool) {
	var none T
	r := f.r
	if f.dead() {
		return none, errCrashed, true
	}
	r.gate()
	if f.dead() {
		return none, errCrashed, true
	}
	r.mu.Lock()
	delay := time.Duration(0)
	if time.Now().Before(r.latEnd) {
		delay = r.delay
	}
	partEnd, oneWayEnd := r.partEnd, r.oneWayEnd
	r.mu.Unlock()
	if delay > 0 && !sleepUntil(ctx, time.Now().Add(delay)) {
		return none, fmt.Errorf("slow link: %w", ctx.Err()), false
	}
	switch now := time.Now(); {
	case f.r.w.outage():
		return none, fmt.Errorf("%w: backend down (simulated)", claim.ErrUnavailable), false
	case now.Before(f.r.w.stalled()):
		// The backend is stopped (SIGSTOP, a long GC): the request waits
		// in its socket and lands when it resumes, whether or not the
		// caller still waits for the reply.
		type reply struct {
			v   T
			err error
		}
		landed := make(chan reply, 1)
		f.r.w.wg.Go(func() {
			time.Sleep(time.Until(f.r.w.stalled())) // the harness's stall, not a production wait
			v, err := apply(context.WithoutCancel(ctx))
			landed <- reply{v, err}
		})
		select {
		case rep := <-landed:
			return rep.v, rep.err, true
		case <-ctx.Done():
			return none, fmt.Errorf("backend stalled: %w", ctx.Err()), false
		}
	case now.Before(partEnd):
		// The request is lost: the caller hears nothing until it gives up.
		if sleepUntil(ctx, partEnd) {
			return none, fmt.Errorf("%w: request lost (simulated partition)", claim.ErrUnavailable), false
		}
		return none, fmt.Errorf("partitioned: %w", ctx.Err()), false
	case now.Before(oneWayEnd):
		_, _ = apply(ctx) // it lands; its reply does not come back
		if sleepUntil(ctx, oneWayEnd) {
			return none, fmt.Errorf("%w: reply lost (simulated one-way partition)", claim.ErrUnavailable), false
		}
		return none, fmt.Errorf("reply lost: %w", ctx.Err()), false
	}
	v, err := apply(ctx)
	// A slow link is slow both ways: the reply takes as long to come back,
	// and is lost to a caller that stops waiting meanwhile (its request
	// took effect all the same).
	if delay > 0 && !sleepUntil(ctx, time.Now().Add(delay)) {
		return none, fmt.Errorf("slow link, reply lost: %w", ctx.Err()), false
	}
	return v, err, true
}

// faultyControls is the replica's view of the operator's register: its
// reads (and writes) cross the replica's faulty link, as its claims do.
type faultyControls struct {
	f     *faulty
	inner claim.Controls
}

func (c faultyControls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	return call(c.f, ctx, func(ctx context.Context) (claim.Control, error) { return c.inner.Put(ctx, e) })
}

// PutBatch crosses the link as one request, as the backend's batch does
// (claim.BatchPutter), so the real backends' batches meet the faults too.
func (c faultyControls) PutBatch(ctx context.Context, cs []claim.Control) ([]claim.Control, []error) {
	type answer struct {
		got  []claim.Control
		errs []error
	}
	a, err := call(c.f, ctx, func(ctx context.Context) (answer, error) {
		got, errs := claim.PutBatch(ctx, c.inner, cs)
		return answer{got, errs}, nil
	})
	if err != nil {
		a = answer{make([]claim.Control, len(cs)), make([]error, len(cs))}
		for i := range a.errs {
			a.errs[i] = err
		}
	}
	return a.got, a.errs
}

func (c faultyControls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	return call(c.f, ctx, func(ctx context.Context) ([]claim.Control, error) { return c.inner.List(ctx, prefix) })
}

func (f *faulty) Renew(ctx context.Context, c *claim.Claim, lease time.Duration) error {
	base := *c // the caller's claim changes only if the reply arrives
	sent := time.Now()
	renewed, err := call(f, ctx, func(ctx context.Context) (claim.Claim, error) {
		r := base
		err := f.inner.Renew(ctx, &r, lease)
		if err == nil {
			r.Requested = sent // see Claim
			f.r.w.log.Renewed(f.name, &r)
		}
		return r, err
	})
	if err == nil {
		c.Deadline, c.Requested, c.Lease = renewed.Deadline, renewed.Requested, renewed.Lease
	}
	return err
}

func (f *faulty) Ping(ctx context.Context) error {
	_, err := call(f, ctx, func(context.Context) (struct{}, error) { return struct{}{}, nil })
	return err
}

func (f *faulty) Close() error { return nil }

type batchReply struct {
	cls  []*claim.Claim
	errs []error
}

// The runner reads the hold and the loss watch through these: a wrapper
// without them hid both from it (stop 65).
var (
	_ claim.TakeoverHolder = (*faulty)(nil)
	_ claim.LossWatcher    = (*faulty)(nil)
)

// TakeoversHeld implements claim.TakeoverHolder, as the claimers that
// hold takeovers do, so that the runner sees the hold (its log, its
// gauge, its overlap probe): the inner claimer's own, or over the memory
// store the harness's (Claim).
func (f *faulty) TakeoversHeld(lease time.Duration) bool {
	if _, mem := f.inner.(*memory.Claimer); mem {
		return !f.r.w.cfg.NoHold && f.unanswered.HoldAt(lease, time.Now())
	}
	return claim.HeldBy(f.inner, lease)
}

// WatchLoss implements claim.LossWatcher with the inner claimer's watch,
// if it has one (the redis claimer's done watcher), as TakeoversHeld.
func (f *faulty) WatchLoss(report func(*claim.DataLossError)) { claim.WatchLossOf(f.inner, report) }

// Claim is one call, faulted as a whole, whatever the batch holds.
func (f *faulty) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	// A real client stamps Requested when the request leaves, before the
	// network (a slow link, a stalled server) delays it: the claims carry
	// the caller's send time, not the store's arrival time, so the runner
	// meets the clock estimates it meets in production (the backend's
	// clock as of a grant, read through Requested, runs ahead by the
	// request's trip).
	sent := time.Now()
	mem, _ := f.inner.(*memory.Claimer)
	if f.r.w.cfg.NoHold {
		mem = nil
	}
	hold := mem != nil && f.unanswered.HoldAt(lease, sent)
	chronic := mem != nil && f.unanswered.ChronicAt(lease, sent)
	rep, err := call(f, ctx, func(ctx context.Context) (batchReply, error) {
		var cls []*claim.Claim
		var errs []error
		if mem != nil {
			// A bid that waited in a stalled backend, or on a slow link,
			// past a quarter lease takes no lapsed lease over, and its
			// replica holds takeovers back as after an unanswered call:
			// the networked claimers compare the backend's clock with the
			// bid's send.
			waited := time.Since(sent) > lease/4
			if waited {
				f.unanswered.NoteAt(time.Now())
			}
			cls, errs = mem.ClaimHolding(ctx, runs, lease, hold || waited)
		} else {
			cls, errs = f.inner.Claim(ctx, runs, lease)
		}
		for _, cl := range cls {
			if cl != nil {
				cl.Requested = sent
			}
		}
		f.r.w.log.Claimed(f.name, sent, runs, lease, cls, errs)
		if chronic {
			f.r.w.mu.Lock()
			if f.r.w.chronic == nil {
				f.r.w.chronic = map[string]bool{}
			}
			for _, cl := range cls {
				if cl != nil {
					f.r.w.chronic[cl.Token] = true
				}
			}
			f.r.w.mu.Unlock()
		}
		return batchReply{cls, errs}, nil
	})
	if err != nil {
		rep = batchReply{make([]*claim.Claim, len(runs)), make([]error, len(runs))}
		for i := range rep.errs {
			rep.errs[i] = err
		}
	}
	return rep.cls, rep.errs
}

// Release is one call, faulted as a whole.
func (f *faulty) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	errs, err := call(f, ctx, func(ctx context.Context) ([]error, error) {
		sent := time.Now()
		errs := f.inner.Release(ctx, cls, outs)
		f.r.w.log.Released(f.name, sent, cls, outs, errs)
		return errs, nil
	})
	if err != nil {
		errs = make([]error, len(cls))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

func (f *faulty) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	return call(f, ctx, func(ctx context.Context) ([]claim.Record, error) {
		return f.inner.History(ctx, job, limit)
	})
}

// Histories is one call, faulted as a whole.
func (f *faulty) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	return call(f, ctx, func(ctx context.Context) ([][]claim.Record, error) {
		return claim.Histories(ctx, f.inner, qs)
	})
}

// inPod runs do as one process named name on r's host (kubectl exec), in
// r's current incarnation (waiting for one to be up), with a runner of its
// own over r's link: it shares r's link and host faults and dies with r.
// do's context ends when r crashes or stops; ok is false if it did. kill
// kills the process alone (kill -9, its pod stays up): its calls and
// handlers die as in a crash of r, and do's context ends.
func (r *replica) inPod(ctx context.Context, name string, do func(ctx context.Context, run *runner.Runner, kill func()) error) (ok bool, err error) {
	var gen int
	var rctx context.Context
	for {
		r.mu.Lock()
		var stopped chan struct{}
		gen, rctx, stopped = r.gen, r.ctx, r.stopped
		r.mu.Unlock()
		select {
		case <-stopped: // down: wait for the next incarnation
			if !sleepUntil(ctx, time.Now().Add(r.w.cfg.Lease/3)) {
				return false, ctx.Err()
			}
			continue
		default:
		}
		break
	}
	inner, err := r.w.cfg.Open(name)
	if err != nil {
		return false, err
	}
	defer inner.Close()
	r.mu.Lock()
	if r.execs == nil {
		r.execs = map[string]bool{}
	}
	r.execs[name] = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.execs, name)
		r.mu.Unlock()
	}()
	pctx, cancel := context.WithCancel(rctx)
	defer cancel()
	c := newFaulty(r, gen, inner, name)
	c.killed = new(atomic.Bool)
	kill := func() {
		if !c.killed.Swap(true) {
			r.w.log.Add(history.Event{Kind: history.Crash, Replica: name})
		}
		cancel()
	}
	// The process reads and writes the register as the CLI's does (it
	// names the runs it carries there), across the pod's link.
	err = do(pctx, r.runner(c, func(opts *runner.Options) {
		if r.w.cfg.Controls != nil {
			opts.Controls = control.New(faultyControls{c, r.w.cfg.Controls}, nil)
		}
	}), kill)
	return rctx.Err() == nil, err
}
