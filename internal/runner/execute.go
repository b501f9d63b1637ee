package runner

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/job"
)

// Final statuses of a run on this replica, as logged and counted.
const (
	StatusSucceeded   = "succeeded"
	StatusFailed      = "failed"
	StatusLeaseLost   = "lease_lost"
	StatusInterrupted = "interrupted"
	StatusTimeout     = "timeout"
)

// Skip reasons.
const (
	ReasonHeld    = "held"
	ReasonDone    = "done"
	ReasonOverlap = "overlap"
	ReasonMisfire = "misfire"
)

// dispatcher carries what one Run call's goroutines share.
type dispatcher struct {
	r       *Runner
	ctx     context.Context // cancelled at shutdown: stops claiming and standing by
	execCtx context.Context // cancelled only after ShutdownGrace
	standby *sync.WaitGroup
	exec    *sync.WaitGroup
	// slots admits Options.MaxClaims claim calls at a time, in arrival
	// order (blocked channel senders are served first in, first out); nil
	// admits all.
	slots chan struct{}
	// batch, when the claimer claims in batches, sends every claim call
	// instead (and slots are not used).
	batch *batcher
	// ends, when the claimer releases in batches, sends every release.
	ends *releaser
	// spread is the hold window of the runs being dispatched; only Run's
	// loop reads and writes it.
	spread time.Duration
}

// dispatch starts the life of one run: claim, stand by, execute. Only
// Run's loop calls it (it reads the loop's spread).
func (d *dispatcher) dispatch(j *jobState, at time.Time, misfired bool) {
	d.start(j, at, misfired, d.spread)
}

func (d *dispatcher) start(j *jobState, at time.Time, misfired bool, spread time.Duration) {
	if at.IsZero() {
		return
	}
	misfired = misfired && d.r.opts.Now().Sub(at) > d.r.lateTolerance()
	run := claim.Run{Job: j.Name, At: at.UTC()}
	j.setLive(at, watching, +1)
	d.standby.Go(func() {
		defer j.setLive(at, watching, -1)
		if j.Overlap == OverlapForbid && d.overlaps(j, at) {
			// Record the skip in the backend, once: whichever replica wins
			// the run ends it as skipped; the others hear done. A holder
			// may be a ghost (a grant whose reply was lost) or die: stand
			// by for it as for any run.
			d.contend(j, run, misfired, ReasonOverlap)
			return
		}
		if !misfired && !d.hold(run, spread) {
			return
		}
		d.contend(j, run, misfired, "")
	})
}

// recoverProbe is how many recent runs of each job the start-up recovery
// reads. A run left live by a holder that died while no replica was up
// is among its job's latest: nobody dispatched the instants after it.
const recoverProbe = 16

// recover finds, at start-up, the runs the backend still records as live
// (running or interrupted) and contends for each like a standby: their
// holder may have died while no replica stood by for them (a one-replica
// deployment, or every standby restarted since), and the look-back at the
// latest instant alone would leave an older one behind for good. A run
// still held is waited for; one handed back or expired is taken over,
// attempt+1, however old it is: a takeover is not a misfire. It retries
// until the backend answers or Run's ctx ends.
func (d *dispatcher) recover(h claim.Historian, now time.Time) {
	r := d.r
	warned := false
	for _, j := range r.jobs {
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(d.ctx, r.opts.Lease)
			recs, err := h.History(ctx, j.Name, recoverProbe)
			cancel()
			if err == nil {
				for _, rec := range recs {
					if rec.Status.Live() && !rec.At.After(now) {
						d.start(j, rec.At, false, 0)
					}
				}
				break
			}
			if d.ctx.Err() != nil {
				return
			}
			if !warned {
				r.log.WarnContext(d.ctx, "cannot list live runs to recover; retrying", "instance", r.opts.Instance,
					"claimer", r.opts.ClaimerName, "job", j.Name, "error", err.Error())
				warned = true
			}
			t := time.NewTimer(jitter(min(r.opts.RenewEvery, time.Duration(1<<min(attempt, 6))*50*time.Millisecond)))
			select {
			case <-d.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// overlaps reports whether an earlier run of j still holds a claim. A run
// executing here is known to; a run this replica only watched as held
// elsewhere is probed again now, because the watcher's last look may be
// stale and every replica must reach the same verdict.
func (d *dispatcher) overlaps(j *jobState, at time.Time) bool {
	executing, watched := j.earlierLive(at)
	if executing {
		return true
	}
	for _, prev := range watched {
		cl, err := d.claim(claim.Run{Job: j.Name, At: prev})
		switch {
		case err == nil:
			// Its holder died: granted() hands it back as a missed run
			// (its window has passed) or runs it (then it overlaps).
			d.granted(j, cl, false)
			if executing, _ := j.earlierLive(at); executing {
				return true
			}
		case errors.Is(err, claim.ErrDone):
		default: // held, or unknown because the backend is unreachable
			return true
		}
	}
	return false
}

// hold waits until this replica's share of spread past run's instant
// before its first bid for run (see Options.Spread). The hold counts from
// the instant, not from now: a replica that took longer to get to the run
// (thousands due at once) does not bid later for it. It returns false if
// Run's ctx ended the wait.
func (d *dispatcher) hold(run claim.Run, spread time.Duration) bool {
	wait := holdFor(run.ID(), d.r.opts.Instance, spread) - d.r.opts.Now().Sub(run.At)
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	select {
	case <-d.ctx.Done():
		t.Stop()
		return false
	case <-t.C:
		return true
	}
}

// holdFor maps (run id, instance) uniformly onto [0, spread).
func holdFor(runID, instance string, spread time.Duration) time.Duration {
	if spread <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(runID))
	h.Write([]byte{0})
	h.Write([]byte(instance))
	// FNV's last bytes barely reach the high bits; mix them (splitmix64's
	// finalizer) so instances that differ in one character spread too.
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return time.Duration(float64(x>>11) / (1 << 53) * float64(spread))
}

// contend claims run, standing by while another replica holds it, until the
// run is won, done, or no longer worth waiting for. With a skip reason, a
// won run is not executed but ended as skipped for that reason, so that
// the decision is a fact of the backend (history, status page, the other
// replicas) rather than a line in each replica's log.
func (d *dispatcher) contend(j *jobState, run claim.Run, misfired bool, skip string) {
	r := d.r
	var unavailable error
	heldLogged := false
	for attempt := 0; ; attempt++ {
		cl, err := d.claim(run)
		switch {
		case err == nil && skip != "":
			d.skip(run, cl, skip, slog.LevelInfo)
			d.release(cl, claim.Skipped)
			return
		case err == nil:
			if d.granted(j, cl, misfired) {
				return
			}
			// The grant came back too late to trust and was handed back as
			// interrupted: keep contending, or nobody may run it.
		case errors.Is(err, claim.ErrDone):
			d.skip(run, nil, ReasonDone, slog.LevelDebug)
			return
		case errors.Is(err, claim.ErrHeld):
			var loss *claim.DataLossError
			if errors.As(err, &loss) {
				r.dataLost(d.ctx, loss)
			}
			if !heldLogged {
				d.skip(run, nil, ReasonHeld, slog.LevelDebug)
				heldLogged = true
			}
			unavailable = nil
		case d.ctx.Err() != nil:
			return
		default:
			// Fail closed: nothing runs unclaimed. Log the first failure of a
			// streak once, at error; the claim is retried below.
			if unavailable == nil {
				r.log.ErrorContext(d.ctx, "claim failed; retrying", append(runAttrs(r, run, nil), "error", err.Error())...)
			}
			unavailable = err
		}
		// Stand by. With overlap forbidden a held run keeps later instants
		// skipped while it lives, so standing by lasts until it ends; the
		// takeover itself is bounded in granted().
		wait := jitter(r.opts.RenewEvery)
		if unavailable != nil {
			wait = jitter(min(r.opts.RenewEvery, time.Duration(1<<min(attempt, 6))*50*time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-d.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// dataLost warns, once per loss, that the backend lost its data: every
// run is held by it for a while, which is safe but deserves an operator's
// eye (the done markers of runs finished just before went too). Every run
// in flight reports the same loss; the first report warns and counts.
func (r *Runner) dataLost(ctx context.Context, loss *claim.DataLossError) {
	r.mu.Lock()
	first := loss.Until.After(r.lossUntil)
	if first {
		r.lossUntil = loss.Until
	}
	r.mu.Unlock()
	if !first {
		return
	}
	r.opts.Metrics.dataLost(r.opts.ClaimerName)
	r.log.WarnContext(ctx, "claimer backend lost its data", "instance", r.opts.Instance, "claimer", r.opts.ClaimerName,
		"held_until", loss.Until.UTC().Format(time.RFC3339Nano), "error", loss.Error())
}

// claim makes one bounded claim call, timed and counted.
func (d *dispatcher) claim(run claim.Run) (*claim.Claim, error) {
	r := d.r
	if r.isClosing() {
		return nil, errClosing
	}
	if d.batch != nil {
		return d.batch.claim(run)
	}
	if d.slots != nil {
		select {
		case d.slots <- struct{}{}:
		case <-d.ctx.Done():
			return nil, d.ctx.Err()
		}
		defer func() { <-d.slots }()
	}
	// A claim that takes longer than a third of the lease is treated as
	// failed: the reply may still be in flight, so the run stays held
	// until the lease expires and is then taken over, never run twice.
	ctx, cancel := context.WithTimeout(d.ctx, r.opts.Lease/3)
	defer cancel()
	start := time.Now()
	cl, err := r.opts.Claimer.Claim(ctx, run, r.opts.Lease)
	r.opts.Metrics.claimed(run.Job, r.opts.ClaimerName, err, time.Since(start))
	return cl, err
}

// granted decides what to do with a won claim.
// It returns false when the grant arrived too late to trust and was handed
// back, so the caller should go on contending for the run.
func (d *dispatcher) granted(j *jobState, cl *claim.Claim, misfired bool) bool {
	r := d.r
	now := r.opts.Now()
	// A run first granted long after its instant (the backend was out of
	// reach meanwhile) misfired, however it was dispatched: its policy
	// decides, as for a run found late by the loop. Retention is sized to
	// that window (config.ClaimWindow), not to how long an outage lasts.
	misfired = misfired || now.Sub(cl.Run.At) > r.lateTolerance()
	switch {
	case d.tooLate(cl):
		return false
	case misfired && cl.Attempt == 1 && (j.Misfire == MisfireSkip || now.Sub(cl.Run.At) > j.Grace):
		// Only a run that never started misfires. A later attempt is a
		// takeover of a run whose holder died or handed it back: it ran on
		// time and must finish, however late this replica came to it.
		d.skip(cl.Run, cl, ReasonMisfire, slog.LevelInfo)
		d.release(cl, claim.Skipped)
	case cl.Attempt > j.MaxAttempts:
		err := fmt.Errorf("attempt %d exceeds max_attempts %d", cl.Attempt, j.MaxAttempts)
		d.finished(cl, StatusFailed, 0, err)
		d.release(cl, claim.Failed)
	default:
		// Live before the standby that won it stops counting, so a later
		// instant never sees a gap and overlaps this run.
		j.setLive(cl.Run.At, executing, +1)
		d.exec.Go(func() {
			status := d.execute(j, cl)
			if status != StatusLeaseLost || d.ctx.Err() != nil {
				j.setLive(cl.Run.At, executing, -1)
				return
			}
			// The run was handed back or taken over, not finished: stand
			// by for it like any replica, or it may be left to nobody
			// (the other standbys may have stopped meanwhile).
			j.setLive(cl.Run.At, watching, +1)
			j.setLive(cl.Run.At, executing, -1)
			defer j.setLive(cl.Run.At, watching, -1)
			d.contend(j, cl.Run, false, "")
		})
	}
	return true
}

// tooLate hands cl back as interrupted, and reports true, when it reached
// this replica only after the window in which its lease may be trusted (a
// stalled process, an overloaded host, a slow backend): the lease may be
// gone and another replica running the run. keepAlive would cancel the
// handler at once, but it would have started.
func (d *dispatcher) tooLate(cl *claim.Claim) bool {
	r := d.r
	late := time.Since(cl.TrustedUntil(r.trustMargin()))
	if late < 0 {
		return false
	}
	err := fmt.Errorf("claim reached the handler %v past its trust window: %w", late.Round(time.Millisecond), claim.ErrLeaseLost)
	r.opts.Logger.WarnContext(d.ctx, "lease not confirmed in time; not starting run", runAttrs(r, cl.Run, cl)...)
	d.release(cl, claim.Interrupted)
	d.finished(cl, StatusLeaseLost, 0, err)
	return true
}

// execute runs the handler under a kept-alive lease and releases the claim
// with the outcome. It returns the run's final status.
func (d *dispatcher) execute(j *jobState, cl *claim.Claim) string {
	r := d.r
	if d.tooLate(cl) { // checked again: the exec goroutine may start late too
		return StatusLeaseLost
	}
	// The backend's clock as of the grant, read before keepAlive owns
	// cl's lease fields: Deadline is backend time, Requested local.
	grantedAt := cl.Deadline.Add(-cl.Lease)
	offset := grantedAt.Sub(cl.Requested)
	backendNow := func() time.Time { return time.Now().Add(offset) }

	ctx, cancel := context.WithCancelCause(d.execCtx)
	defer cancel(nil)
	hctx := ctx
	if j.Timeout > 0 {
		var stop context.CancelFunc
		hctx, stop = context.WithTimeoutCause(ctx, j.Timeout, job.ErrTimeout)
		defer stop()
	}
	// The keep-alive outlives the handler: it renews until the release has
	// landed, so a slow release (a loaded backend, a lost reply retried)
	// cannot let the lease lapse and the finished run be executed again.
	// Shutdown does not stop it either: a handler that outlives
	// ShutdownGrace (it ignores its context) still holds its run.
	keepCtx, stopKeep := context.WithCancel(context.WithoutCancel(d.execCtx))
	defer stopKeep()
	keepDone := make(chan struct{})
	go func() {
		defer close(keepDone)
		d.keepAlive(keepCtx, ctx, cl, cancel)
	}()
	settle := func(status string, o claim.Outcome, elapsed time.Duration, err error) string {
		status, err = d.settle(cl, status, o, err)
		stopKeep()
		<-keepDone
		d.finished(cl, status, elapsed, err)
		return status
	}

	// A replica whose wall clock runs ahead claims runs before their
	// instant; it holds the claim until the instant comes on the
	// backend's clock, then runs it on time.
	if early := cl.Run.At.Sub(backendNow()); early > 0 {
		if early > r.opts.MaxClockSkew {
			r.opts.Logger.WarnContext(ctx, "replica clock ahead of the backend; holding the run until its instant",
				append(runAttrs(r, cl.Run, cl), "ahead_ms", early.Milliseconds())...)
		}
		t := time.NewTimer(early)
		select {
		case <-ctx.Done():
			t.Stop()
			return settle(StatusLeaseLost, claim.Interrupted, 0, context.Cause(ctx))
		case <-d.ctx.Done(): // shutting down: the run has not started, hand it back
			t.Stop()
			return settle(StatusInterrupted, claim.Interrupted, 0, job.ErrShutdown)
		case <-t.C:
		}
	}
	if j.Overlap == OverlapForbid {
		owner, err := d.owner(ctx, j, cl, grantedAt, backendNow)
		switch {
		case err != nil:
			return settle(StatusLeaseLost, claim.Interrupted, 0, err)
		case owner != nil:
			d.skip(cl.Run, cl, ReasonOverlap, slog.LevelInfo)
			stopKeep()
			<-keepDone
			d.release(cl, claim.Skipped)
			return string(claim.StatusSkipped)
		}
	}

	logger := r.opts.Logger.With(runAttrs(r, cl.Run, cl)...)
	start := time.Now()
	r.opts.Metrics.started(cl.Run.Job, r.opts.Now().Sub(cl.Run.At))
	logger.InfoContext(hctx, "run started")
	r.emit(Event{Kind: EventStarted, Run: cl.Run, Claim: cl})
	err := callHandler(hctx, j.Handler, job.Run{
		Job: cl.Run.Job, ScheduledAt: cl.Run.At, ID: cl.ID(), Fence: cl.Fence, Attempt: cl.Attempt,
		Instance: r.opts.Instance, Params: j.Params, Logger: logger,
	})
	cause := context.Cause(hctx)
	cancel(nil) // the handler is done; the cause recorded above stays
	elapsed := time.Since(start)
	r.emit(Event{Kind: EventReturned, Run: cl.Run, Claim: cl, Err: err, Ran: elapsed})

	var status string
	var outcome claim.Outcome
	switch {
	case err == nil:
		// The work is done, whatever happened meanwhile (a shutdown, a lost
		// lease): handing it back would run it again. If the lease was
		// lost, the release says so.
		status, outcome = StatusSucceeded, claim.Succeeded
	case errors.Is(cause, claim.ErrLeaseLost):
		// Hand the run back at once in case the claim is still ours; another
		// replica then takes over without waiting for the lease.
		status, outcome = StatusLeaseLost, claim.Interrupted
	case errors.Is(cause, job.ErrShutdown):
		status, outcome = StatusInterrupted, claim.Interrupted
	case errors.Is(cause, job.ErrTimeout):
		status, outcome = StatusTimeout, claim.Failed
	default:
		status, outcome = StatusFailed, claim.Failed
	}
	return settle(status, outcome, elapsed, err)
}

// settle releases cl with o and returns the status the run ends with: o's
// own only if the backend accepted the release. A release refused because
// the run was taken over, or never confirmed, ends the run as lease_lost,
// whatever its handler did: another replica may run it again, and only
// one of them may report success.
func (d *dispatcher) settle(cl *claim.Claim, status string, o claim.Outcome, err error) (string, error) {
	rerr := d.release(cl, o)
	switch {
	case rerr == nil:
	case errors.Is(rerr, claim.ErrLeaseLost):
		status = StatusLeaseLost
		if err == nil {
			err = fmt.Errorf("release refused, the run was taken over: %w", rerr)
		}
	default:
		status = StatusLeaseLost
		err = errors.Join(err, fmt.Errorf("release not confirmed: %w", rerr))
	}
	if status == StatusLeaseLost && err == nil {
		err = claim.ErrLeaseLost
	}
	return status, err
}

// firstChance is when a run granted at granted (backend time) could first
// execute: not before its instant.
func firstChance(at, granted time.Time) time.Time {
	if granted.After(at) {
		return granted
	}
	return at
}

// ownerProbe is how many recent runs of a job the overlap probe reads
// first. A live run older than that is behind the runs skipped for it
// (overlap skips are recorded): a full page whose oldest run was skipped
// is read again, eight times deeper, up to maxOwnerProbe.
const (
	ownerProbe    = 16
	maxOwnerProbe = 16 * 8 * 8 * 8
)

// owner asks the backend whether another run of j owns the job while cl
// is about to execute (overlap: forbid). Runs are ordered by when they
// could first execute: the later of their grant (StartedAt, backend time)
// and their instant, ties broken by fence. cl yields to a live run (status
// running, lease not expired) that comes first. Every replica reads the
// same facts, so two runs that see each other agree on which one yields;
// a run that does not see the other was probed before the other was
// granted or fell due, so the other comes later and yields to it. A
// replica's own memory cannot give that: it may have restarted, skipped
// the earlier instant, or lost its lease on it while paused. cl must not
// start before its instant (execute waits for it), or a run granted
// meanwhile would come first by this order and not yield. grantedAt is
// cl's grant on the backend's clock (keepAlive owns cl's lease fields).
func (d *dispatcher) owner(ctx context.Context, j *jobState, cl *claim.Claim, grantedAt time.Time, backendNow func() time.Time) (*claim.Record, error) {
	h, ok := d.r.opts.Claimer.(claim.Historian)
	if !ok {
		return nil, nil // the local checks in dispatch are all there is
	}
	backoff := 50 * time.Millisecond
	for limit := ownerProbe; ; {
		pctx, cancel := context.WithTimeout(ctx, d.r.opts.Lease/3)
		recs, err := h.History(pctx, j.Name, limit)
		cancel()
		if err == nil {
			now := backendNow()
			mine := firstChance(cl.Run.At, grantedAt)
			for _, rec := range recs {
				if rec.RunID == cl.ID() || rec.Status != claim.StatusRunning || !rec.LeaseUntil.After(now) {
					continue
				}
				if theirs := firstChance(rec.At, rec.StartedAt); theirs.Before(mine) || theirs.Equal(mine) && rec.Fence < cl.Fence {
					return &rec, nil
				}
			}
			if len(recs) == limit && recs[len(recs)-1].Status == claim.StatusSkipped && limit < maxOwnerProbe {
				limit *= 8
				continue
			}
			return nil, nil
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done(): // the lease could not be kept meanwhile
			t.Stop()
			return nil, fmt.Errorf("overlap probe: %w (%w)", context.Cause(ctx), err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

func callHandler(ctx context.Context, h job.Handler, run job.Run) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, run)
}

// keepAlive renews cl every RenewEvery until ctx is done. While the handler
// runs (run is not done), a refused renewal, or a trust window that passes
// before one succeeds, cancels the run with cause ErrLeaseLost. The window is
// measured on the monotonic clock from the moment the last successful
// request was sent. Once the handler has returned, keepAlive only keeps the
// lease up for the release, and leaves the verdict to it.
//
// keepAlive is the only reader and writer of cl's lease fields (Deadline,
// Requested, Lease) while it runs; Release reads only the immutable ones.
func (d *dispatcher) keepAlive(ctx, run context.Context, cl *claim.Claim, cancel context.CancelCauseFunc) {
	r := d.r
	margin := r.trustMargin()
	next := time.NewTimer(r.opts.RenewEvery)
	defer next.Stop()
	lost := func(msg string, attrs ...any) {
		if run.Err() == nil {
			r.opts.Logger.WarnContext(ctx, msg, append(runAttrs(r, cl.Run, cl), attrs...)...)
			cancel(claim.ErrLeaseLost)
		}
	}
	for {
		trusted := cl.TrustedUntil(margin)
		expire := time.NewTimer(time.Until(trusted))
		select {
		case <-ctx.Done():
			expire.Stop()
			return
		case <-expire.C:
			lost("lease not confirmed in time; cancelling run")
			return
		case <-next.C:
			expire.Stop()
		}
		rctx, rcancel := context.WithDeadline(ctx, trusted)
		err := r.opts.Claimer.Renew(rctx, cl, r.opts.Lease)
		rcancel()
		if run.Err() != nil && errors.Is(err, claim.ErrLeaseLost) {
			return // the release landed first: nothing left to keep alive
		}
		r.opts.Metrics.renewed(r.opts.ClaimerName, err)
		switch {
		case err == nil:
			next.Reset(r.opts.RenewEvery)
		case errors.Is(err, claim.ErrLeaseLost):
			lost("lease lost; cancelling run", "error", err.Error())
			return
		case ctx.Err() != nil:
			return
		default:
			// Transient: retry soon; the trust window decides when to give up.
			next.Reset(min(r.opts.RenewEvery, 100*time.Millisecond))
		}
	}
}

// trustMargin is how long before the earliest possible end of a lease
// (TrustedUntil) this replica stops trusting it: room for the drift between
// its monotonic clock and the backend's.
func (r *Runner) trustMargin() time.Duration { return r.opts.Lease / 10 }

// release ends cl with o, retrying transient failures until the backend
// answers (the keep-alive, where one runs, holds the lease meanwhile): a
// lost release would let the run be executed again, and a release that
// lands after an outage still ends the run if nobody took it over.
// Release compares the token, so a retry past a takeover is refused,
// never applied. Once Run is shutting down it gives up after a lease.
func (d *dispatcher) release(cl *claim.Claim, o claim.Outcome) error {
	r := d.r
	backoff := 50 * time.Millisecond
	var giveUp <-chan time.Time
	for logged := false; ; {
		var err error
		if d.ends != nil {
			err = d.ends.release(cl, o)
		} else {
			// A whole lease per try: a slow link must not turn every try
			// into a timeout while the keep-alive holds the lease.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(d.execCtx), r.opts.Lease)
			err = r.opts.Claimer.Release(ctx, cl, o)
			cancel()
		}
		if err == nil || errors.Is(err, claim.ErrLeaseLost) || errors.Is(err, claim.ErrInvalid) {
			return err
		}
		if !logged {
			r.log.ErrorContext(d.ctx, "release failed; retrying", append(runAttrs(r, cl.Run, cl), "outcome", string(o), "error", err.Error())...)
			logged = true
		}
		if giveUp == nil && d.ctx.Err() != nil {
			t := time.NewTimer(r.opts.Lease)
			defer t.Stop()
			giveUp = t.C
		}
		shutdown := d.ctx.Done()
		if giveUp != nil {
			shutdown = nil // already counting down
		}
		t := time.NewTimer(backoff)
		select {
		case <-giveUp:
			t.Stop()
			r.log.ErrorContext(d.ctx, "release failed", append(runAttrs(r, cl.Run, cl), "outcome", string(o), "error", err.Error())...)
			return err
		case <-shutdown:
			t.Stop()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (d *dispatcher) skip(run claim.Run, cl *claim.Claim, reason string, level slog.Level) {
	r := d.r
	r.opts.Logger.Log(d.ctx, level, "run skipped", append(runAttrs(r, run, cl), "reason", reason)...)
	r.opts.Metrics.skipped(run.Job, reason)
	r.emit(Event{Kind: EventSkipped, Run: run, Claim: cl, Reason: reason})
}

func (d *dispatcher) finished(cl *claim.Claim, status string, elapsed time.Duration, err error) {
	r := d.r
	attrs := append(runAttrs(r, cl.Run, cl), "status", status, "duration_ms", elapsed.Milliseconds())
	level := slog.LevelInfo
	if err != nil {
		attrs = append(attrs, "error", err.Error())
		level = slog.LevelWarn
	}
	r.opts.Logger.Log(context.Background(), level, "run finished", attrs...)
	r.opts.Metrics.finished(cl.Run.Job, status, elapsed)
	r.emit(Event{Kind: EventFinished, Run: cl.Run, Claim: cl, Status: status, Err: err, Ran: elapsed})
}

// runAttrs are the keys every run event carries (DESIGN.md, "Log events").
func runAttrs(r *Runner, run claim.Run, cl *claim.Claim) []any {
	a := []any{"job", run.Job, "scheduled_at", run.At.UTC().Format(time.RFC3339Nano),
		"run_id", run.ID(), "instance", r.opts.Instance, "claimer", r.opts.ClaimerName}
	if cl != nil {
		a = append(a, "fence", cl.Fence, "attempt", cl.Attempt)
	}
	return a
}

// jitter spreads retries of replicas that lost the same bid by ±20%.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + rand.N(2*d/5+1)
}

// What a live entry is: a run executing on this replica, or one this
// replica contends for or watches as held elsewhere.
const (
	executing = iota
	watching
)

func (j *jobState) setLive(at time.Time, kind, delta int) {
	k := at.UnixNano()
	j.mu.Lock()
	defer j.mu.Unlock()
	e := j.live[k]
	e[kind] += delta
	if e == [2]int{} {
		delete(j.live, k)
	} else {
		j.live[k] = e
	}
}

// earlierLive reports whether a run of j before at executes here, and which
// earlier runs this replica watches.
func (j *jobState) earlierLive(at time.Time) (exec bool, watched []time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for k, e := range j.live {
		if k >= at.UnixNano() {
			continue
		}
		if e[executing] > 0 {
			return true, nil
		}
		watched = append(watched, time.Unix(0, k).UTC())
	}
	return false, watched
}
