package compare

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/runner"
)

// cell is one claimer under one fault scenario: a fresh namespace, its
// replicas, the workload, the faults and what was recorded.
//
// Goroutines: run owns one per replica (its runner) and, through wg, the
// fault drivers and the timers that end a pause or a partition. All of them
// stop when stop is closed at the end of the cell; run returns after every
// one has exited.
type cell struct {
	o        *Options
	kind     string
	scenario string
	faults   faultSet
	lease    time.Duration
	work     *workload
	plan     plan
	rec      *recorder
	store    *fencedStore
	ns       *namespace
	reps     []*replica
	trig     map[string]*trigger // pause, crash, partition: fired by the run they hit
	stop     chan struct{}
	wg       sync.WaitGroup
	t0       time.Time
	// cut is when the cell was interrupted, if it was: the steady window
	// is judged up to there (analyze).
	cut time.Time
}

// trigger fires a fault once, on the first replica that meets it after it
// is armed (at the plan's fault instant).
type trigger struct{ armed, fired atomic.Bool }

func (t *trigger) take() bool {
	return t != nil && t.armed.Load() && t.fired.CompareAndSwap(false, true)
}

// runCell runs kind under scenario and returns its report cell.
func runCell(ctx context.Context, o *Options, kind, scenario string) *Cell {
	if scenario == FaultRandom {
		return runRandom(ctx, o, kind)
	}
	res := &Cell{Claimer: kind, Fault: scenario}
	f := faultSet(strings.Split(scenario, "+"))
	if why := unsupported(o, kind, f); why != "" {
		res.Status, res.Reason = StatusSkipped, why
		return res
	}
	w, err := newWorkload(o.Jobs, o.Lease)
	if err != nil {
		res.Status, res.Reason = StatusError, err.Error()
		return res
	}
	c := &cell{o: o, kind: kind, scenario: scenario, faults: f, lease: o.Lease, work: w,
		plan: newPlan(o, scenario, f, w), rec: newRecorder(time.Now()), store: newFencedStore(),
		trig: map[string]*trigger{}, stop: make(chan struct{})}
	for _, name := range []string{FaultPause, FaultCrash, FaultPartition} {
		if f.has(name) {
			c.trig[name] = &trigger{}
		}
	}
	ns, err := openNamespace(ctx, o, kind, f)
	if err != nil {
		return res.unopened(err)
	}
	defer ns.closeInto(res)
	c.ns = ns
	var cut atomic.Int64 // when ctx ended, in Unix ns
	defer context.AfterFunc(ctx, func() { cut.Store(time.Now().UnixNano()) })()
	if f.network() && len(ns.targets) == 0 {
		res.Status, res.Reason = StatusSkipped, "no TCP link to the backend to fault"
		return res
	}
	err = c.openReplicas(ctx)
	defer c.closeReplicas()
	if err == nil {
		err = c.run(ctx)
	}
	if err != nil {
		res.Status, res.Reason = StatusError, err.Error()
		return res
	}
	if ctx.Err() != nil {
		// Cut short: the runs due after the interruption never had their
		// chance, and are not counted missed.
		c.cut = time.Now()
		if n := cut.Load(); n != 0 { // else its AfterFunc has yet to run
			c.cut = time.Unix(0, n)
		}
	}
	c.analyze(res)
	if ctx.Err() != nil {
		res.Status, res.Reason = StatusError, "interrupted before the cell ended"
		res.Notes = append(res.Notes, fmt.Sprintf("interrupted %s into the cell: only the runs due up to a margin before then are judged",
			c.cut.Sub(c.t0).Round(time.Millisecond)))
	}
	return res
}

// unopened reports a cell whose namespace could not be opened: skipped
// when the backend is not configured here, an error otherwise.
func (res *Cell) unopened(err error) *Cell {
	res.Status, res.Reason = StatusError, err.Error()
	if s := (errSkip{}); errors.As(err, &s) {
		res.Status = StatusSkipped
	}
	return res
}

func (c *cell) openReplicas(ctx context.Context) error {
	for i := range c.o.Replicas {
		rep := &replica{id: fmt.Sprintf("r%d", i+1), c: c, offset: c.plan.offsets[i], dead: make(chan struct{})}
		c.reps = append(c.reps, rep)
		var addrs []string // nil: the namespace's own servers
		if c.faults.network() {
			for _, t := range c.ns.targets {
				l, err := newLink(t)
				if err != nil {
					return fmt.Errorf("proxy to %s: %w", t, err)
				}
				rep.links = append(rep.links, l)
				addrs = append(addrs, l.Addr())
			}
		}
		inner, err := c.ns.open(ctx, rep.id, addrs)
		if err != nil {
			return fmt.Errorf("open %s claimer for %s: %w", c.kind, rep.id, err)
		}
		rep.claimer = wrap(inner, rep, c.rec)
	}
	return nil
}

func (c *cell) closeReplicas() {
	for _, rep := range c.reps {
		if rep.claimer != nil {
			_ = rep.claimer.Close()
		}
		for _, l := range rep.links {
			_ = l.Close()
		}
	}
}

// run starts the replicas (staggered), applies the faults, and after the
// duration stops everything and waits for it.
func (c *cell) run(ctx context.Context) error {
	runners := make([]*runner.Runner, len(c.reps))
	for i, rep := range c.reps {
		// A crashed replica's late words are not facts for the checker.
		logged := c.rec.log.Observer(rep.id, func() bool { return !rep.crashed.Load() })
		observe := func(e runner.Event) { c.rec.observe(e); logged(e) }
		r, err := runner.New(runner.Options{Claimer: rep.claimer, ClaimerName: c.kind, Instance: rep.id,
			Lease: c.lease, MaxClockSkew: c.o.MaxClockSkew, Now: rep.now, Observe: observe}, c.runnerJobs(rep))
		if err != nil {
			return err
		}
		runners[i] = r
	}
	c.t0 = time.Now()
	c.rec.t0 = c.t0
	var rwg sync.WaitGroup
	for i, rep := range c.reps {
		rctx, cancel := context.WithCancel(ctx)
		rep.cancel = cancel
		rwg.Go(func() {
			defer cancel()
			if c.sleepUntil(rctx, c.t0.Add(c.plan.stagger[i])) {
				_ = runners[i].Run(rctx)
			}
		})
	}
	c.startFaults()
	c.wg.Go(c.probe)
	c.sleepUntil(ctx, c.t0.Add(c.o.Duration))
	close(c.stop)
	for _, rep := range c.reps {
		rep.cancel()
	}
	rwg.Wait()
	c.wg.Wait()
	return nil
}

// probe measures how late a 50ms timer fires in this process while the
// cell runs: when the harness itself is starved of CPU, the claimers'
// numbers say more about the machine than about them.
func (c *cell) probe() {
	const every = 50 * time.Millisecond
	t := time.NewTimer(every)
	defer t.Stop()
	want := time.Now().Add(every)
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.rec.lag(time.Since(want))
			want = time.Now().Add(every)
			t.Reset(every)
		}
	}
}

// sleepUntil waits for t; false if ctx or the cell ended first.
func (c *cell) sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
	case <-c.stop:
	}
	return false
}

// startFaults applies the scenario's faults on the plan's schedule.
func (c *cell) startFaults() {
	p, bg := c.plan, context.Background()
	if c.faults.has(FaultLatency) {
		for i, rep := range c.reps {
			for _, l := range rep.links {
				l.SetLatency(p.latency[i])
			}
			c.rec.fault(FaultLatency, rep.id, c.t0, 0, fmt.Sprintf("+%v", p.latency[i].Round(time.Millisecond)))
		}
	}
	c.wg.Go(func() {
		if !c.sleepUntil(bg, c.t0.Add(p.faultAt)) {
			return
		}
		for _, t := range c.trig {
			t.armed.Store(true)
		}
		if c.faults.has(FaultRedisRestart) || c.faults.has(FaultPostgresRestart) {
			c.restartServer()
		}
		if len(c.trig) == 0 || !c.sleepUntil(bg, c.t0.Add(p.faultAt+p.fallback)) {
			return
		}
		for _, name := range []string{FaultPause, FaultCrash, FaultPartition} {
			if t := c.trig[name]; t != nil && t.fired.CompareAndSwap(false, true) {
				c.apply(name, c.reps[p.victim], "no run met the fault in time; applied to a seeded replica")
			}
		}
	})
	if c.faults.has(FaultReset) {
		c.wg.Go(func() {
			for _, r := range p.resets {
				if !c.sleepUntil(bg, c.t0.Add(r.at)) {
					return
				}
				rep := c.reps[r.replica]
				for _, l := range rep.links {
					l.ResetAll()
				}
				c.rec.fault(FaultReset, rep.id, time.Now(), 0, "")
			}
		})
	}
}

// longStarted and billingWrote are the handlers' hooks that fire armed
// faults on the replica holding the run: a crash or a partition hits the
// holder of a long run, a pause the holder of a billing run right after its
// first fenced write.
func (c *cell) longStarted(rep *replica) {
	if c.trig[FaultCrash].take() {
		c.apply(FaultCrash, rep, "holder of a long run, a third of a lease into it")
	}
	if c.trig[FaultPartition].take() {
		c.apply(FaultPartition, rep, "holder of a long run")
	}
}

func (c *cell) billingWrote(rep *replica) {
	if c.trig[FaultPause].take() {
		c.apply(FaultPause, rep, "holder of a billing run, after its first fenced write")
	}
}

// pauseFor is how long a pause freezes its replica: well past the lease,
// so that the run is taken over and the successor writes before it wakes.
func (c *cell) pauseFor() time.Duration { return c.lease * 5 / 2 }

func (c *cell) apply(name string, rep *replica, note string) {
	switch name {
	case FaultPause:
		c.rec.fault(FaultPause, rep.id, time.Now(), c.pauseFor(), note)
		rep.freeze(c.pauseFor())
	case FaultCrash:
		c.wg.Go(func() {
			if c.sleepUntil(context.Background(), time.Now().Add(c.lease/3)) {
				c.rec.fault(FaultCrash, rep.id, time.Now(), 0, note)
				rep.crash()
			}
		})
	case FaultPartition:
		d := 2 * c.lease
		c.rec.fault(FaultPartition, rep.id, time.Now(), d, note)
		for _, l := range rep.links {
			l.Partition(true)
		}
		c.wg.Go(func() {
			c.sleepUntil(context.Background(), time.Now().Add(d))
			for _, l := range rep.links {
				l.Partition(false)
			}
		})
	}
}

// restartServer crashes one server of the cell and starts it again on the
// same port. A redis-server is killed and back at once, empty (no
// persistence): the test is data loss. PostgreSQL shuts down immediately
// (no checkpoint) and stays down for a lease before it replays its WAL: the
// test is an outage as long as a lease, across which committed claims
// must hold and renewals cannot.
func (c *cell) restartServer() {
	servers := c.ns.servers
	if len(servers) == 0 {
		return
	}
	s := servers[c.plan.node%len(servers)]
	kind, down := FaultRedisRestart, time.Duration(0)
	note := fmt.Sprintf("%s killed (SIGKILL, no persistence) and restarted empty", s.Addr())
	if isPostgres(s) {
		kind, down = FaultPostgresRestart, c.lease
		note = fmt.Sprintf("%s crashed (immediate shutdown, no checkpoint), kept down for a lease, restarted; it replayed its WAL", s.Addr())
	}
	if len(servers) > 1 {
		note = fmt.Sprintf("node %d of %d: %s", c.plan.node%len(servers)+1, len(servers), note)
	}
	start := time.Now()
	s.Crash()
	c.sleepUntil(context.Background(), start.Add(down))
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		note += "; restart failed: " + err.Error()
	}
	c.rec.fault(kind, "", start, time.Since(start), note)
}
