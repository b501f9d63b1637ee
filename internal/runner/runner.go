// Package runner is the replica's runtime: it computes every job's instants,
// claims each run through a claim.Claimer, executes the winner's handler
// under a renewed lease, stands by as a loser to take over a run whose holder
// died, and shuts down gracefully.
//
// Goroutines and who owns them: Run owns the scheduling loop and, through
// two wait groups, every goroutine it starts. The standby group holds,
// for the runs dispatched together on time, one goroutine that holds each
// back and sends its first bid (bidTogether), then one per run won or
// standing by; one per other dispatched run (hold, claim, stand by); the
// start-up recovery; and the one sending claim batches while bids wait; the exec
// group holds one goroutine per executing run, each of which joins its own
// keep-alive before it ends, and the one sending release batches while
// releases queue behind the batch in flight. Standbys stop when Run's ctx
// is done; executing handlers get ShutdownGrace, then their context is
// cancelled with cause job.ErrShutdown and their claims are released as
// interrupted. Run returns only after every one of them has exited.
//
// Contexts: two bound that work, and every function that needs one takes
// it as a parameter (ctx, then execCtx); none is stored in a struct.
//
//   - ctx, Run's, is done at shutdown. It bounds the scheduling loop, the
//     start-up recovery, every standby (hold, claim, stand by) and every
//     claim batch (each also bounded by Lease/3). To an execution and a
//     release it is only a signal: once it is done, a run still waiting for
//     its instant is handed back instead of started, a run whose lease was
//     lost is not contended for again, and a failing release gives up a
//     lease later.
//   - execCtx, derived from ctx without its cancellation, is cancelled with
//     cause job.ErrShutdown only once ShutdownGrace has passed. It bounds
//     every execution: its handler (under the job's timeout, and cancelled
//     when the lease is lost) and its overlap owner probe.
//   - Neither bounds keep-alives or release calls, which take only their
//     values: a keep-alive renews until its run's release has landed (a
//     handler that outlives ShutdownGrace still holds its run), each release
//     batch is bounded by a lease, and the hand-back of a grant whose bidder
//     left by Lease/3.
//
// Trigger passes its own ctx as both.
package runner

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

// Overlap policies.
const (
	OverlapForbid    = "forbid"
	OverlapAllow     = "allow"
	OverlapBufferOne = "buffer-one"
	OverlapReplace   = "replace"
)

// Misfire policies.
const (
	MisfireSkip    = "skip"
	MisfireRunOnce = "run-once"
	MisfireRunAll  = "run-all"
)

// Job is one scheduled job as the runner sees it.
type Job struct {
	Name        string
	Schedule    *schedule.Schedule
	Handler     job.Handler
	Timeout     time.Duration // 0: none
	Overlap     string        // OverlapForbid (default), OverlapAllow, OverlapBufferOne, OverlapReplace
	MaxAttempts int           // grants of one run before it is failed; default 3
	// Backoff, when positive, retries a run whose handler failed or timed
	// out, within the same run: after Backoff, doubled per attempt up to
	// MaxBackoff (default max(10m, Backoff)), until MaxAttempts grants,
	// takeovers included, were spent (see retry.go).
	Backoff, MaxBackoff time.Duration
	Misfire             string        // MisfireSkip (default), MisfireRunOnce or MisfireRunAll
	Grace               time.Duration // how late a misfired run may still start; default 1h
	MaxCatchup          int           // run-all: the most missed runs caught up; default 10
	// Jitter delays each instant's start by an offset hashed from (job,
	// instant) in [0, Jitter), the same on every replica (see jitter.go).
	Jitter time.Duration
	Params job.Params
}

// Options configure a Runner.
type Options struct {
	Claimer     claim.Claimer
	ClaimerName string // for logs and metrics: postgres, redis, …
	Instance    string
	// Lease is how long a claim lives without renewal (default 30s);
	// RenewEvery how often the holder renews it (default Lease/3).
	Lease, RenewEvery time.Duration
	// MaxClockSkew bounds the offset between replica clocks (default 2s).
	// Instants later than that on the local clock count as misfired.
	MaxClockSkew time.Duration
	// ShutdownGrace is how long running handlers may finish after Run's ctx
	// is done before they are cancelled and released as interrupted.
	ShutdownGrace time.Duration
	// Spread is the longest a replica holds back its first bid for a run
	// (default min(Lease/10, DefaultSpread); negative: never). The hold is
	// a hash of the run id and the instance, different for every replica
	// and every run, so the replica with the shortest hold for a run
	// usually wins it and runs due at one instant are shared out evenly,
	// instead of going to whichever replica woke first. With Controls,
	// replicas also learn of each other (members.go): the replica whose
	// hash of a run is least among those up owns it and holds nothing,
	// the others between Spread and 1.5×Spread, so the hold leaves the
	// lag of a healthy fleet. Without a view of the fleet it adds at most
	// Spread to the schedule lag, about Spread/(replicas+1) on average.
	// It cannot hide clock skew larger than itself. When many runs fall due at one instant, the spread of
	// that instant widens to 100µs per run (1s for 10,000), at most
	// Lease/3: replicas reach the last of thousands of runs at different
	// moments, and holds shorter than that difference would hand most runs
	// to whichever replica got there first. Runs due together are also
	// dispatched in order of this replica's hold, so a replica that gets
	// to its bids after its holds have passed (its CPU busy with
	// thousands) bids first for the runs it would have won on time.
	Spread  time.Duration
	Logger  *slog.Logger
	Metrics *Metrics // nil: no metrics
	// Now is the wall clock instants are computed on (default time.Now).
	// Leases and trust windows use the monotonic clock, never this one.
	Now func() time.Time
	// Observe, when set, receives every run event synchronously; tests use it
	// instead of sleeping.
	Observe func(Event)
	// Controls is the operator's state in the backend: pauses and run
	// requests (nil: none are honoured). ControlEvery is how often the
	// replica reads it (default 1s): a pause or a request reaches it
	// within that.
	Controls     *control.Store
	ControlEvery time.Duration
	// SweepEvery is how often every job's recent history is read again
	// for live runs nobody watches (default Lease; negative: never): a
	// `trigger --here` or backfill process killed mid-run leaves its run
	// to the fleet, which takes it over within SweepEvery plus a lease.
	// One history read per 1,000 jobs, spread over the period.
	SweepEvery time.Duration
	// Forgets is how long after a run ends the claimer still knows it
	// ended (Redis, Redlock and etcd: their done_ttl; 0: until pruned),
	// and ForgetsKey the setting that says so. Backfill refuses a range
	// that reaches back further: a run forgotten there looks never run,
	// and would run again.
	Forgets    time.Duration
	ForgetsKey string
	// Tracer, when set, traces every run granted here and every claim and
	// release batch (see tracing.go); nil: no traces.
	Tracer trace.Tracer
}

// Runner schedules and executes jobs on one replica.
type Runner struct {
	opts Options
	jobs []*jobState
	// byName indexes jobs: start-up looks up to a thousand records' jobs
	// in it, and a fleet may run 100,000 jobs.
	byName map[string]*jobState
	log    *slog.Logger

	// closing is set once shutdown begins: no new dispatches. Atomic, as
	// pauses: every one of thousands of runs due at once reads both.
	closing atomic.Bool
	// pauses is the pause switches as last read (see controls.go); nil
	// until a read succeeded.
	pauses atomic.Pointer[control.Pauses]
	// requests is the operator's requests as last read, by run id (see
	// controls.go); nil until a read succeeded.
	requests atomic.Pointer[map[string]*control.Request]
	// view is the fleet as last read (see members.go); nil until a read
	// succeeded.
	view atomic.Pointer[membership]
	// unreachableAt is when a claim of this replica last failed (unix ns
	// on its clock; 0: never): a run that then starts past its deadline
	// was kept from it by the backend, not by this replica falling behind.
	unreachableAt atomic.Int64
	// claimLoggedAt is when "claim failed; retrying" was last logged
	// (unix ns), claimQuiet how many runs' failures went unlogged since:
	// one line per failing run was 1,900 lines per replica for one 15s
	// stall with 2,000 jobs (an outside review). See claimFailed.
	claimLoggedAt, claimQuiet atomic.Int64

	mu sync.Mutex
	// lossUntil is the end of the last backend data loss this runner
	// warned about (see dataLost).
	lossUntil time.Time
	// pausedLogged remembers which jobs' pause this replica has logged.
	pausedLogged map[string]bool
	// running holds the cancel of every execution here, by run id, and
	// revoked the revocations last read (run id → the run replacing it):
	// see overlap.go.
	running map[string]context.CancelCauseFunc
	revoked map[string]string
	// unrequested holds the manual runs a fresh read of the requests did
	// not name, by run id (see requestOf).
	unrequested map[string]bool
	// alongside holds the runs the register named as executed beside
	// their job's live runs (control.Unwatched.Alongside: a backfill's),
	// by run id, as read so far: a takeover of one here, by whatever
	// path it comes (a standby of the instant, the sweep, recovery),
	// runs beside them too. Bounded as unrequested is.
	alongside map[string]bool
	// twinWarned is when checkTwin last warned.
	twinWarned time.Time

	// announced counts this replica's announcements (checkTwin).
	announced atomic.Int64
}

type jobState struct {
	Job
	mu sync.Mutex
	// live counts, per instant (unix ns), the runs executing here or watched
	// as held elsewhere.
	live map[int64][2]int
	// watchedAs holds, per instant watched here, why it was dispatched
	// (only where that is not a plain on-time instant): an overlap probe
	// that wins it (liveBefore) hands it on as its watcher would have.
	watchedAs map[int64]origin
	// lateAtStart holds the instants past their deadline that start-up's
	// misfire decision runs (the look-back instant, run-all's catch-up),
	// by unix ns (see granted).
	lateAtStart map[int64]bool
	// held records, by run id, the runs of j this replica executes (won,
	// waiting for their turn or running), as the overlap probe must count
	// them (see owners).
	held map[string]heldRun
	// recording counts, per instant (unix ns), the claims this replica
	// holds on it only to record it missed (recordChunk): no run an
	// overlap probe should yield to (waitsOut).
	recording map[int64]int
}

// New validates the jobs and options and returns a Runner.
func New(opts Options, jobs []Job) (*Runner, error) {
	if opts.Claimer == nil {
		panic("runner: nil claimer")
	}
	opts.Lease = cmp.Or(opts.Lease, 30*time.Second)
	opts.RenewEvery = cmp.Or(opts.RenewEvery, opts.Lease/3)
	opts.MaxClockSkew = cmp.Or(opts.MaxClockSkew, 2*time.Second)
	opts.Spread = cmp.Or(opts.Spread, min(opts.Lease/10, DefaultSpread))
	opts.ControlEvery = cmp.Or(opts.ControlEvery, time.Second)
	opts.SweepEvery = cmp.Or(opts.SweepEvery, opts.Lease)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.RenewEvery >= opts.Lease {
		return nil, fmt.Errorf("runner: renew_every %v must be shorter than lease %v", opts.RenewEvery, opts.Lease)
	}
	opts.Metrics.ready(opts.ClaimerName)
	r := &Runner{opts: opts, log: opts.Logger.With("component", "runner"), pausedLogged: map[string]bool{}, unrequested: map[string]bool{}, alongside: map[string]bool{}, byName: map[string]*jobState{}}
	for _, j := range jobs {
		switch {
		case j.Name == "" || j.Schedule == nil || j.Handler == nil:
			return nil, fmt.Errorf("runner: job %q needs a name, a schedule and a handler", j.Name)
		case r.byName[j.Name] != nil:
			return nil, fmt.Errorf("runner: job %q listed twice", j.Name)
		}
		j.Overlap = cmp.Or(j.Overlap, OverlapForbid)
		j.Misfire = cmp.Or(j.Misfire, MisfireSkip)
		j.MaxAttempts = cmp.Or(j.MaxAttempts, 3)
		j.Grace = cmp.Or(j.Grace, time.Hour)
		j.MaxCatchup = cmp.Or(j.MaxCatchup, 10)
		if j.Backoff > 0 {
			j.MaxBackoff = max(cmp.Or(j.MaxBackoff, 10*time.Minute), j.Backoff)
		}
		js := &jobState{Job: j, live: map[int64][2]int{}, held: map[string]heldRun{}}
		r.jobs = append(r.jobs, js)
		r.byName[j.Name] = js
	}
	return r, nil
}

// lateTolerance is how far past its instant, on the local clock, a run may
// be dispatched before it counts as misfired: the skew between replicas plus
// room for a loaded machine.
func (r *Runner) lateTolerance() time.Duration { return lateTolerance(r.opts.MaxClockSkew) }

func lateTolerance(maxClockSkew time.Duration) time.Duration { return 2*maxClockSkew + 5*time.Second }

// RequestWindow is how long after it was made a request for a run of a
// job with misfire grace grace is still picked up by the fleet, whose
// clocks may differ by maxClockSkew; a request older than that is never
// run (it stays remembered, so a retry of it does not run either).
func RequestWindow(grace, maxClockSkew time.Duration) time.Duration {
	return max(grace, lateTolerance(maxClockSkew))
}

// spreadPerRun widens the spread of an instant at which many runs fall due
// at once (see Options.Spread).
const spreadPerRun = 100 * time.Microsecond

// spreadFor is the spread for an instant at which due runs fall due here.
func (r *Runner) spreadFor(due int) time.Duration {
	if r.opts.Spread <= 0 {
		return r.opts.Spread
	}
	return max(r.opts.Spread, min(time.Duration(due)*spreadPerRun, r.opts.Lease/3))
}

// preferred orders runs due together by this replica's hold on each,
// shortest first (see hold). Where thousands fall due at once, a replica
// reaches its bids later than its holds, and would bid in the order the
// runs were dispatched, the same on every replica: the fastest would win
// nearly all. In this order each replica bids first for the runs it is
// the likeliest to win, where the others hold longest, so a slower
// replica still gets its share, and replicas contend less for each run.
func (r *Runner) preferred(ready []due, spread time.Duration) {
	if spread <= 0 {
		return
	}
	for i, e := range ready {
		ready[i].hold = r.holdOf(claim.Run{Job: e.job.Name, At: e.at.UTC()}.ID(), spread)
	}
	slices.SortStableFunc(ready, func(a, b due) int { return cmp.Compare(a.hold, b.hold) })
}

// Defaults for Options.
const (
	// DefaultSpread caps the default Spread.
	DefaultSpread = 100 * time.Millisecond
)

// nextMemo remembers the next instants found for one batch of jobs. A
// schedule's instants are a pure function of its spec, its zone and the
// time (package schedule), so jobs that share a spec (thousands of
// tenants' nightly jobs) share one search per instant.
type nextMemo map[nextKey]time.Time

type nextKey struct {
	spec, zone string
	after      int64
}

func (m nextMemo) next(s *schedule.Schedule, after time.Time) time.Time {
	k := nextKey{s.String(), s.Location().String(), after.UnixNano()}
	n, ok := m[k]
	if !ok {
		n = s.Next(after)
		m[k] = n
	}
	return n
}

// maxWait caps each sleep of the loop so that a wall-clock jump or a
// suspend is noticed within a second, not at the next instant.
const maxWait = time.Second

// due is an instant of a job waiting in the loop's heap: at is the
// instant (the run's id), fire when it starts (at, jittered).
type due struct {
	at, fire time.Time
	job      *jobState
	// hold is this replica's hold on the run (holdFor), once preferred
	// has ordered the runs due together.
	hold time.Duration
}

func dueAt(j *jobState, at time.Time) due { return due{at: at, fire: j.fire(at), job: j} }

// schedule puts j's next instant, at, in the loop's heap. A schedule with
// no further instant (the cron library searches five years ahead; @every
// ends where a Duration since the epoch does) leaves the heap: as a zero
// instant it would be due at once, and the loop would spin on it.
func (r *Runner) schedule(ctx context.Context, h *dueHeap, j *jobState, at time.Time) {
	if at.IsZero() {
		r.log.WarnContext(ctx, "schedule exhausted", "job", j.Name, "instance", r.opts.Instance, "schedule", j.Schedule.String())
		return
	}
	heap.Push(h, dueAt(j, at))
}

type dueHeap []due

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].fire.Before(h[j].fire) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(due)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Run schedules until ctx is done, then shuts down gracefully: no new
// claims, running handlers get ShutdownGrace, then are cancelled and
// released as interrupted. It returns once every goroutine it started has
// exited: nil, or an error wrapping claim.ErrUnavailable if some release
// was given up at the shutdown (the backend silent for a lease), whose
// runs other replicas take over as their leases lapse.
func (r *Runner) Run(ctx context.Context) error {
	// Executions outlive ctx by up to ShutdownGrace, so they hang off a
	// context of their own that only the shutdown path cancels.
	execCtx, cancelExec := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelExec(nil)
	var standby, exec sync.WaitGroup
	d := r.dispatcher(&standby, &exec)
	d.adopts = true
	if lw, ok := r.opts.Claimer.(claim.LossWatcher); ok {
		// A loss no claim meets (a restart of an idle fleet's backend)
		// is warned about and counted all the same.
		lctx := context.WithoutCancel(ctx)
		lw.WatchLoss(func(loss *claim.DataLossError) { r.dataLost(lctx, loss) })
	}

	if th, ok := r.opts.Claimer.(claim.TakeoverHolder); ok {
		standby.Go(func() { r.watchHold(ctx, th) })
	}

	// Pauses are honoured from the first instant on: read them before
	// dispatching anything.
	r.readPauses(ctx)
	standby.Go(func() { d.watchControls(ctx, execCtx) })
	now := r.opts.Now()
	h := &dueHeap{}
	nexts := nextMemo{}
	for _, j := range r.jobs {
		// The latest instant before start-up (the look-back) may have been
		// missed while no replica was up, or may still be running
		// elsewhere: start-up recovery finds out by claiming it like any
		// run, once it has read the job's history and stands by for the
		// runs live there (recover). Under run-all, it catches it up in
		// turn with the instants before it (catchup.go).
		if prev := r.lookBack(j, now); !prev.IsZero() && j.Misfire != MisfireRunAll {
			j.runsAtStart(prev)
		}
		r.schedule(ctx, h, j, nexts.next(j.Schedule, now))
	}
	started := now
	standby.Go(func() { d.recover(ctx, execCtx, started) })
	standby.Go(func() { d.sweep(ctx, execCtx) })
	timer := time.NewTimer(0)
	defer timer.Stop()
loop:
	for {
		now = r.opts.Now()
		d.spread = r.opts.Spread
		if h.Len() > 0 && !(*h)[0].fire.After(now) {
			due := 0
			for _, e := range *h {
				if !e.fire.After(now) {
					due++
				}
			}
			d.spread = r.spreadFor(due)
		}
		var ready []due
		for h.Len() > 0 && !(*h)[0].fire.After(now) {
			ready = append(ready, heap.Pop(h).(due))
		}
		r.preferred(ready, d.spread)
		var together []*firstBid
		for i, e := range ready {
			if now.Sub(e.fire) > r.lateTolerance() {
				// The loop was paused or the clock jumped: the latest
				// instant goes under the job's misfire policy, the ones it
				// fell behind on are recorded (fellBehind).
				d.fellBehind(ctx, execCtx, e.job, e.at, now)
				ready[i].at = now // the next instant is the one after now
				continue
			}
			if d.together(e.job, e.at) {
				run := claim.Run{Job: e.job.Name, At: e.at.UTC()}
				e.job.setLive(e.at, watching, +1)
				together = append(together, &firstBid{j: e.job, run: run, holdEnd: e.fire.Add(e.hold)})
				continue
			}
			d.dispatch(ctx, execCtx, e.job, e.at, "")
		}
		if len(together) > 0 {
			d.bidTogether(ctx, execCtx, together)
		}
		// Each job's next instant only once everything due is dispatched:
		// where thousands fall due at once, the last would otherwise wait
		// for the others' (a sparse cron spec's next instant costs tens of
		// µs to find).
		clear(nexts)
		for _, e := range ready {
			r.schedule(ctx, h, e.job, nexts.next(e.job.Schedule, e.at))
		}
		wait := maxWait
		if h.Len() > 0 {
			wait = min(wait, (*h)[0].fire.Sub(now))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			break loop
		case <-timer.C:
		}
	}

	r.closing.Store(true)
	d.closeStandby()
	standby.Wait()
	done := make(chan struct{})
	go func() { exec.Wait(); close(done) }()
	grace := time.NewTimer(r.opts.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		r.log.WarnContext(ctx, "shutdown grace passed; interrupting running handlers", "shutdown_grace", r.opts.ShutdownGrace.String())
		cancelExec(job.ErrShutdown)
		r.awaitHandlers(ctx, done)
	}
	if n := d.unconfirmed.Load(); n > 0 {
		// Nothing is lost: each such run is taken over once its lease
		// lapses. But the shutdown was not clean, and a supervisor or an
		// operator watching exit codes should hear it.
		return fmt.Errorf("%w: %d releases were not confirmed at shutdown (logged as release failed);"+
			" other replicas take their runs over as their leases lapse", claim.ErrUnavailable, n)
	}
	return nil
}

// stubbornEvery is how often a shutdown that waits on handlers which
// ignore their cancellation says which.
const stubbornEvery = 5 * time.Second

// awaitHandlers waits until done (every execution returned), saying every
// stubbornEvery which runs still execute. A handler that ignores its
// context keeps its claim alive until it returns: handed back while it
// still runs, the run could start on another replica beside it. The
// operator, or the orchestrator's kill, decides; this says what the
// shutdown waits on (an outside review found it silent for as long).
func (r *Runner) awaitHandlers(ctx context.Context, done <-chan struct{}) {
	tick := time.NewTicker(stubbornEvery)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			r.mu.Lock()
			ids := slices.Sorted(maps.Keys(r.running))
			r.mu.Unlock()
			r.log.WarnContext(ctx, "handlers ignore their cancellation; their claims are kept alive until they return",
				"instance", r.opts.Instance, "runs", ids)
		}
	}
}

// TriggerOptions say who asked for a run Trigger executes, and how it
// treats a live earlier run of its job.
type TriggerOptions struct {
	// Overlap is OverlapAllow to run even while an earlier run of the job
	// is live; "" obeys the job's overlap policy.
	Overlap string
	// By and Note are logged with the run ("run requested"), as a
	// request's are.
	By, Note string
}

// Trigger claims and executes one run of the named job now, outside its
// schedule, through the same claim path as scheduled runs (batched, timed,
// counted), and returns its final status. The manual instant
// (control.ManualInstant) has a sub-second part, so it cannot collide
// with a scheduled instant (those are whole seconds).
func (r *Runner) Trigger(ctx context.Context, name string, o TriggerOptions) (claim.Status, error) {
	var j *jobState
	for _, x := range r.jobs {
		if x.Name == name {
			j = x
		}
	}
	if j == nil {
		return "", fmt.Errorf("trigger: unknown job %q", name)
	}
	at := control.ManualInstant(r.opts.Now())
	var wg sync.WaitGroup
	defer wg.Wait()
	d := r.dispatcher(&wg, &wg)
	run := claim.Run{Job: name, At: at}
	c, err := d.carry(ctx, run, o.Overlap == OverlapAllow)
	if err != nil {
		return "", fmt.Errorf("trigger %s: %w", name, err) // nothing bid, nothing ran
	}
	cl, err := d.claimUnwatched(ctx, run, false)
	if err != nil {
		c.done(errors.Is(err, claim.ErrDone))
		return "", fmt.Errorf("trigger %s: %w", name, err)
	}
	r.log.InfoContext(ctx, "run requested", append(runAttrs(r, cl.Run, cl), "by", o.By, "note", o.Note, "here", true)...)
	mode := admitByPolicy
	if o.Overlap == OverlapAllow {
		mode = admitAlways
	}
	// Stopped mid-run (SIGTERM, Ctrl-C: ctx ends), the trigger hands its
	// run back interrupted, as a replica's shutdown does, and the fleet's
	// sweep takes it over. Recorded failed, a run that never finished
	// would be lost to the stop; left running, it would wait for a lease
	// its holder no longer renews.
	execCtx, done := handBackOnStop(ctx, 0)
	defer done()
	status, err := d.runToEnd(ctx, execCtx, j, cl, mode, c)
	if err != nil {
		return status, fmt.Errorf("trigger %s: %w", name, err)
	}
	return status, ctx.Err()
}

// handBackOnStop returns the execution context of work run here outside
// the schedule (Trigger, Backfill): cancelled with job.ErrShutdown grace
// after ctx ends (at once for a CLI process's, the replica's
// shutdown_grace for a backfill the API started on it), so its handlers
// stop and their runs are handed back interrupted, as a replica's
// shutdown hands them back. done releases it.
func handBackOnStop(ctx context.Context, grace time.Duration) (execCtx context.Context, done func()) {
	execCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if grace > 0 {
			t := time.NewTimer(grace)
			defer t.Stop()
			select {
			case <-t.C:
			case <-execCtx.Done(): // ended in time
				return
			}
		}
		cancel(job.ErrShutdown)
	})
	return execCtx, func() { stop(); cancel(nil) }
}

// runToEnd executes cl here, ctx as Run's context and execCtx as the
// execution's (Trigger and Backfill have no shutdown grace of their own:
// they hand their runs back interrupted when ctx ends) and, so the caller
// learns how the run ended, carries it on here while it lives: nothing
// stands by for a run outside the schedule but the replicas that read
// its entry in the register (c, which runToEnd marks granted, and ends)
// and the fleet's sweep.
//   - A handler that failed, of a job that retries, is retried here once
//     its backoff has passed.
//   - A run whose lease was lost under it (renewals that could not reach
//     the backend, a paused process) was handed back live, or its lease
//     lapses: it is asked for again, as after a lost answer, and taken
//     over and run here as the next attempt, unless it is found done, or
//     still held after a lease (another process resumed it).
//
// The error says the run could not be carried on because the backend
// stayed out of reach: it may be left live (a grant whose answer was
// lost), for the caller to report; run again, a backfill resumes it.
func (d *dispatcher) runToEnd(ctx, execCtx context.Context, j *jobState, cl *claim.Claim, mode admission, c *carrier) (status claim.Status, err error) {
	defer func() { c.done(status.Terminal() || status == claim.Timeout) }()
	if !c.granted() && mode == admitAlways {
		// The register still names a bid only: a replica taking the run
		// over (this process stopped or gone) would go by the job's
		// policy, and skip for overlap, for good, an instant that ran
		// here beside live runs. Handed back unstarted instead: the
		// fleet takes it over under its policy, or a backfill run again
		// resumes it. Found by the explorer (seed 8137: a partition as
		// the grant came back).
		d.r.log.WarnContext(ctx, "cannot mark the run granted in the register; handing it back unstarted",
			runAttrs(d.r, cl.Run, cl)...)
		if err := d.release(ctx, cl, claim.Interrupted); err != nil {
			return claim.LeaseLost, nil
		}
		return claim.Interrupted, nil
	}
	status = d.execute(ctx, execCtx, j, cl, mode, false)
	for (status == claim.Retrying || status == claim.LeaseLost) && ctx.Err() == nil && execCtx.Err() == nil {
		lost := status == claim.LeaseLost
		if !lost && !sleep(ctx, j.backoff(cl.Attempt)) {
			return status, nil
		}
		next, err := d.claimUnwatched(ctx, cl.Run, lost)
		// Asked as the first attempt was (claimUnwatched): a lost answer
		// must not leave the retry's grant live. A retry's run is held
		// until the failed attempt's release lands: asked again.
		for !lost && errors.Is(err, claim.ErrHeld) {
			if !sleep(ctx, 20*time.Millisecond) {
				return status, nil
			}
			next, err = d.claimUnwatched(ctx, cl.Run, false)
		}
		switch {
		case err == nil:
		case errors.Is(err, claim.ErrDone), errors.Is(err, claim.ErrHeld), ctx.Err() != nil:
			return status, nil // ended elsewhere, or held by a live holder; or the caller stopped
		default:
			return status, fmt.Errorf("carry %s on after %s: %w", cl.ID(), status, err)
		}
		cl = next
		status = d.execute(ctx, execCtx, j, cl, mode, false)
	}
	return status, nil
}

// errClosing stops work that would start after shutdown began.
var errClosing = errors.New("runner: shutting down")

func (r *Runner) isClosing() bool { return r.closing.Load() }
