// This file owns the execution of a won run: the wait for its instant on
// the backend's clock, the overlap owner probe, the handler call, and
// settling its outcome through the release. The lease it runs under is
// kept alive by lease.go; the release itself is release.go's.

package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/job"
)

// execute runs the handler under a kept-alive lease and releases the claim
// with the outcome. It returns the run's final status. execCtx bounds the
// handler (with job.ErrShutdown once ShutdownGrace has passed); ctx is
// Run's: once it is done, a run still waiting for its instant is handed
// back instead of started, and a failing release gives up after a lease.
// mode says what an earlier live run of the job does to this one (see
// overlap.go). lagged says its start counts in the schedule-lag metric:
// a run of the schedule, not one an operator's backfill or trigger
// --here executes (or the fleet takes over from them), whose instant may
// be a month old (an outside review: an API backfill put 30 days of
// "lag" in the histogram, and would have fired the lag alert).
func (d *dispatcher) execute(ctx, execCtx context.Context, j *jobState, cl *claim.Claim, mode admission, lagged bool) claim.Status {
	r := d.r
	if d.tooLate(ctx, cl) { // checked again: the exec goroutine may start late too
		return claim.LeaseLost
	}
	defer r.opts.Metrics.holding(cl.Run.Job)()
	// From here on ctx and execCtx carry the run's span, ended once the
	// run is settled.
	ctx, execCtx, span := r.startRun(ctx, execCtx, cl)
	// The backend's clock as of the grant, read before keepAlive owns
	// cl's lease fields (Deadline is backend time). backendNow is a lower
	// bound of that clock: the grant happened at grantedAt on it, and
	// before now here. Read through Requested instead (when the request
	// left), it would run ahead by the request's trip, seconds on a slow
	// link or a restarting server: a run granted ahead of its instant
	// would then probe for earlier runs before its instant came on the
	// backend, and miss a takeover granted in between that comes first
	// (see owners).
	grantedAt := cl.Deadline.Add(-cl.Lease)
	// The grant's page of its job's records (the overlap probe's first
	// read, see owners), taken before keepAlive shares cl: a running
	// claim does not keep it.
	page := cl.Page
	cl.Page = nil
	trusted, drop := j.hold(cl, grantedAt, r.trustMargin()) // counted by this replica's overlap probes until it ends
	defer drop()
	replied := time.Now()
	backendNow := func() time.Time { return grantedAt.Add(time.Since(replied)) }

	// ectx is this execution's context: cancelled when the lease is lost,
	// at the end of ShutdownGrace (through execCtx), and once the handler
	// has returned; hctx adds the job's timeout for the handler.
	ectx, cancel := context.WithCancelCause(execCtx)
	defer cancel(nil)
	defer r.track(cl.ID(), cancel)() // a revocation cancels it (overlap.go)
	hctx := ectx
	if j.Timeout > 0 {
		var stop context.CancelFunc
		hctx, stop = context.WithTimeoutCause(ectx, j.Timeout, job.ErrTimeout)
		defer stop()
	}
	// The keep-alive outlives the handler: it renews until the release has
	// landed, so a slow release (a loaded backend, a lost reply retried)
	// cannot let the lease lapse and the finished run be executed again.
	// Shutdown does not stop it either: a handler that outlives
	// ShutdownGrace (it ignores its context) still holds its run.
	keepCtx, stopKeep := context.WithCancel(context.WithoutCancel(execCtx))
	defer stopKeep()
	keepDone := make(chan struct{})
	go func() {
		defer close(keepDone)
		d.keepAlive(keepCtx, ectx, cl, cancel, trusted)
	}()
	settle := func(status, o claim.Status, elapsed time.Duration, err error) claim.Status {
		status, err = d.settle(ctx, cl, status, o, err, elapsed)
		stopKeep()
		<-keepDone
		d.finished(ctx, cl, status, elapsed, err)
		endRun(span, status, err)
		return status
	}

	// holdFor keeps the claim, not started, for d: the keep-alive renews
	// it meanwhile. It reports false once the run has been settled (its
	// lease lost, or shutting down: handed back, never started).
	holdFor := func(d time.Duration) (claim.Status, bool) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ectx.Done():
			return settle(claim.LeaseLost, claim.Interrupted, 0, context.Cause(ectx)), false
		case <-ctx.Done():
			return settle(claim.Interrupted, claim.Interrupted, 0, job.ErrShutdown), false
		case <-t.C:
			return "", true
		}
	}
	// A replica whose wall clock runs ahead claims runs before their
	// start (the instant, jittered); it holds the claim until the start
	// comes on the backend's clock, then runs it on time.
	if early := j.fire(cl.Run.At).Sub(backendNow()); early > 0 {
		if early > r.opts.MaxClockSkew {
			r.opts.Logger.WarnContext(ectx, "replica clock ahead of the backend; holding the run until its instant",
				append(runAttrs(r, cl.Run, cl), "ahead_ms", early.Milliseconds())...)
		}
		if status, ok := holdFor(early); !ok {
			return status
		}
	}
	// A retry taken over before its backoff ended (the failed attempt's
	// lease could not be set to the backoff, or its holder died first)
	// waits for the rest of it, as its holder would have.
	if wait := d.backoffLeft(ectx, j, cl); wait > 0 {
		r.opts.Logger.InfoContext(ectx, "retry taken over before its backoff ended; holding the run until it has",
			append(runAttrs(r, cl.Run, cl), "retry_in_ms", wait.Milliseconds())...)
		if status, ok := holdFor(wait); !ok {
			return status
		}
	}
	// end records the run, never started, as status once the keep-alive
	// has stopped.
	end := func(status claim.Status) claim.Status {
		stopKeep()
		<-keepDone
		d.release(ctx, cl, status)
		endRun(span, status, nil)
		return status
	}
	skip := func(reason string) claim.Status {
		d.skip(ctx, cl.Run, cl, reason, slog.LevelInfo)
		return end(claim.Skipped)
	}
	// missed records a run its owners could not be read for before its
	// deadline (errMissedWaiting) missed, as a claim that came that late
	// would have been.
	missed := func() claim.Status {
		span.SetAttributes(attrReason.String(MissedUnavailable))
		d.missed(ctx, cl.Run, cl, MissedUnavailable)
		return end(claim.Missed)
	}
	// overlapped settles a run an earlier live run keeps out: skipped
	// (for good), unless it is the takeover of a run a backfill executed
	// beside its job's live runs, which runs as the backfill ran it (ok
	// false). Unable to tell (the register out of reach), it asks again
	// each RenewEvery while it holds the run: a skip would lose the
	// instant, and a hand-back spends an attempt (MaxAttempts). Not for
	// longer than the late tolerance, though: held here, the run keeps
	// the job's later runs out. Then, the lease lost, or shutting down,
	// it hands the run back.
	overlapped := func() (status claim.Status, ok bool) {
		if cl.Attempt == 1 {
			return skip(ReasonOverlap), true
		}
		giveUp := time.Now().Add(r.lateTolerance())
		for {
			along, err := d.startedAlongside(ctx, cl.Run)
			switch {
			case err == nil && !along:
				return skip(ReasonOverlap), true
			case err == nil:
				return "", false
			case time.Now().After(giveUp):
				return settle(claim.LeaseLost, claim.Interrupted, 0, err), true
			}
			t := time.NewTimer(r.opts.RenewEvery)
			select {
			case <-ctx.Done():
				t.Stop()
				return settle(claim.Interrupted, claim.Interrupted, 0, job.ErrShutdown), true
			case <-ectx.Done():
				t.Stop()
				return settle(claim.LeaseLost, claim.Interrupted, 0, context.Cause(ectx)), true
			case <-t.C:
			}
		}
	}
	switch {
	case mode == admitAlways || j.Overlap == OverlapAllow:
	case mode == admitInTurn || j.Overlap == OverlapBufferOne || j.Overlap == OverlapReplace:
		byPolicy := mode == admitByPolicy
		err := d.awaitTurn(ctx, execCtx, ectx, j, cl, grantedAt, backendNow, &page, byPolicy && j.Overlap == OverlapReplace, byPolicy && j.Overlap == OverlapBufferOne)
		var replaced errReplaced
		switch {
		case errors.As(err, &replaced):
			return skip(ReasonReplaced)
		case errors.Is(err, errBufferFull), errors.Is(err, errOvertaken):
			if status, ok := overlapped(); ok {
				return status
			}
		case errors.Is(err, errStopped):
			return settle(claim.Interrupted, claim.Interrupted, 0, job.ErrShutdown)
		case errors.Is(err, errMissedWaiting):
			return missed()
		case err != nil:
			return settle(claim.LeaseLost, claim.Interrupted, 0, err)
		}
	default: // forbid
		p, err := d.settledOwners(ctx, ectx, j, cl, grantedAt, backendNow, &page)
		d.adopt(ctx, execCtx, j, p.unwatched, origin{takeover: true})
		switch {
		case errors.Is(err, errStopped):
			return settle(claim.Interrupted, claim.Interrupted, 0, job.ErrShutdown)
		case errors.Is(err, errMissedWaiting):
			return missed()
		case err != nil:
			return settle(claim.LeaseLost, claim.Interrupted, 0, err)
		}
		if len(p.owners) > 0 || p.ahead != nil {
			if status, ok := overlapped(); ok {
				return status
			}
		}
	}
	if _, ok := r.replacedBy(cl.ID()); ok {
		// Revoked before it started here: a takeover of a run a later
		// instant replaced.
		return skip(ReasonReplaced)
	}

	if ectx.Err() != nil {
		// The lease was lost while the run waited its turn or its owners'
		// answer (renewals that could not land: a stalled backend): a
		// handler started now would run on a lease nobody trusts, beside
		// a takeover, until it noticed its context (the explorer's overran
		// invariant found such starts, cancelled at once).
		return settle(claim.LeaseLost, claim.Interrupted, 0, context.Cause(ectx))
	}
	logger := r.opts.Logger.With(runAttrs(r, cl.Run, cl)...)
	start := time.Now()
	if lagged {
		r.opts.Metrics.started(cl.Run.Job, r.opts.Now().Sub(j.fire(cl.Run.At)))
	}
	logger.InfoContext(hctx, "run started")
	span.AddEvent("handler started")
	r.emit(Event{Kind: EventStarted, Run: cl.Run, Claim: cl})
	err := callHandler(hctx, j.Handler, job.Run{
		Job: cl.Run.Job, ScheduledAt: cl.Run.At, ID: cl.ID(), Fence: cl.Fence, Attempt: cl.Attempt,
		Instance: r.opts.Instance, Params: j.Params.Clone(), Logger: logger,
	})
	cause := context.Cause(hctx)
	cancel(nil) // the handler is done; the cause recorded above stays
	elapsed := time.Since(start)
	span.AddEvent("handler returned")
	r.emit(Event{Kind: EventReturned, Run: cl.Run, Claim: cl, Err: err, Ran: elapsed})

	var status claim.Status
	var outcome claim.Status
	var replaced errReplaced
	switch {
	case err == nil:
		// The work is done, whatever happened meanwhile (a shutdown, a lost
		// lease): handing it back would run it again. If the lease was
		// lost, the release says so.
		status, outcome = claim.Succeeded, claim.Succeeded
	case errors.As(cause, &replaced):
		// Revoked by a later instant (overlap: replace): ended here, once,
		// so no replica takes it over to run it again.
		d.skip(ctx, cl.Run, cl, ReasonReplaced, slog.LevelInfo)
		status, outcome = claim.Skipped, claim.Skipped
	case errors.Is(cause, claim.ErrLeaseLost):
		// Hand the run back at once in case the claim is still ours; another
		// replica then takes over without waiting for the lease.
		status, outcome = claim.LeaseLost, claim.Interrupted
	case errors.Is(cause, job.ErrShutdown):
		status, outcome = claim.Interrupted, claim.Interrupted
	case errors.Is(cause, job.ErrTimeout):
		status, outcome = claim.Timeout, claim.Failed
	default:
		status, outcome = claim.Failed, claim.Failed
	}
	if status == claim.Failed || status == claim.Timeout {
		if j.retries(cl.Attempt) {
			// Recorded while the keep-alive still holds the lease, which
			// it must stop holding before the cut.
			d.recordAttempt(ctx, j, cl, status, start, err, r.opts.Now().Add(j.backoff(cl.Attempt)))
			stopKeep()
			<-keepDone
			if time.Now().After(cl.TrustedUntil(r.trustMargin())) {
				// The handler outlived its lease (a paused process): the
				// run may already be another replica's next attempt. Not
				// this attempt's to hand on; the lease lapses by itself.
				status = claim.LeaseLost
				d.finished(ctx, cl, status, elapsed, errors.Join(err, claim.ErrLeaseLost))
				endRun(span, status, err)
				return status
			}
			status = d.retryLater(ctx, j, cl, status, elapsed, err)
			endRun(span, status, err)
			return status
		}
		d.recordAttempt(ctx, j, cl, status, start, err, time.Time{})
	}
	return settle(status, outcome, elapsed, err)
}

// settle releases cl with o and returns the status the run ends with: o's
// own only if the backend accepted the release. A release refused because
// the run was taken over, or never confirmed, ends the run as lease_lost,
// whatever its handler did: another replica may run it again, and only
// one of them may report success. ran is how long the handler ran, 0 if
// it did not start. ctx is Run's (see release).
func (d *dispatcher) settle(ctx context.Context, cl *claim.Claim, status, o claim.Status, err error, ran time.Duration) (claim.Status, error) {
	// The attempt ended now, when its handler returned: not when a
	// release refused through an outage came back.
	ended := d.r.opts.Now().UTC()
	if status == claim.Interrupted {
		d.recordEnded(ctx, cl, claim.Interrupted, ended, ran, job.ErrShutdown)
	}
	rerr := d.release(ctx, cl, o)
	switch {
	case rerr == nil:
	case errors.Is(rerr, claim.ErrLeaseLost):
		if ran > 0 {
			// The backend's record is the takeover's now: this
			// attempt, which ran, would leave no trace in the history
			// but its logs (an outside review: a run executed twice
			// showed one attempt).
			how := "its handler returned"
			if err != nil {
				how += " " + err.Error()
			}
			d.recordEnded(ctx, cl, claim.LeaseLost, ended, ran, fmt.Errorf("%s, and its release was refused: the run was taken over", how))
		}
		status = claim.LeaseLost
		if err == nil {
			err = fmt.Errorf("release refused, the run was taken over: %w", rerr)
		}
	default:
		status = claim.LeaseLost
		err = errors.Join(err, fmt.Errorf("release not confirmed: %w", rerr))
	}
	if status == claim.LeaseLost && err == nil {
		err = claim.ErrLeaseLost
	}
	return status, err
}

// probe is what owners found among the live runs of a job.
type probe struct {
	// owners come before the probing run, in order: it yields to them.
	owners []claim.Record
	// newer is the latest run of a later instant, wherever it comes.
	newer *claim.Record
	// ahead comes after the probing run but was granted before it, so it
	// may have been probed before the probing run's grant was visible:
	// it may run without waiting for it, and the probing run must not
	// start beside it. Under replace it is revoked and waited for, as an
	// owner is; otherwise the probing run is skipped, since waiting could
	// wait forever on a run that waits for it.
	ahead *claim.Record
	// unwatched are the live runs before the probing one that this
	// replica neither executes nor watches, for adopt.
	unwatched []claim.Record
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
// first. A live run older than that is behind the runs skipped or missed
// while it lived (both are recorded), or behind runs that wait or wait
// for a retry (buffer-one, a catch-up after an outage): a full page whose
// oldest run did not simply run and end (succeeded, failed) is read
// again, eight times deeper, up to maxOwnerProbe.
const (
	ownerProbe    = claim.PageSize // a grant's page (claim.Claim.Page) is this first read
	maxOwnerProbe = ownerProbe * 8 * 8 * 8
)

// owners asks the backend which other runs of j own the job while cl is
// about to execute (overlap: forbid, buffer-one, replace, or a catch-up
// in turn), in the order they come. Runs are ordered by when they
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
// cl's grant on the backend's clock (keepAlive owns cl's lease fields);
// backendNow must not run ahead of the backend's clock, or a live run
// would look expired, and cl could probe before its instant.
//
// That holds where a grant becomes visible when it is stamped, or where
// a read waits for the grants stamped before it (PostgreSQL, which shows
// a grant only when it commits: its history read waits for the grants
// of its jobs in flight, migration 00005). Where neither holds, a run
// stamped before another's first chance can be invisible to that run's
// probe, come first here, and start beside it. So, as a second line, a
// live run that comes after cl but was granted before it (a lower
// fence) is returned as ahead: cl cannot know whether that run saw cl,
// and never starts beside it (see probe).
//
// A read that fails is asked again until it answers, the lease is lost,
// or cl, a scheduled run that never started, passes the deadline its
// misfire policy gives it (errMissedWaiting, wrapping the read's error):
// held here, unstarted, it would keep the job's later instants out and
// start long past its instant when the reads came back (a history that
// cannot be read: a schema rolled back under a live fleet, a revoked
// grant). A failure that lasts is logged once.
//
// page, if it holds one, is the first read: the grant's own (see
// claim.Claim.Page), taken and emptied by the first call that reads. It
// stands for a probe made at the grant only if the grant came once the
// run fell due: a run the page does not show was granted after it, and
// so comes after cl by the order above. A replica whose clock runs ahead
// is granted early, and reads once the instant has come.
//
// A record's lease is judged as of its read (for a page, as of the
// grant): one that lapsed only after that may have been renewed
// meanwhile, and its run still be live.
func (d *dispatcher) owners(ctx context.Context, j *jobState, cl *claim.Claim, grantedAt time.Time, backendNow func() time.Time, page *[]claim.Record) (probe, error) {
	r := d.r
	backoff := 50 * time.Millisecond
	var failing time.Time // since when the reads fail
	warned := false
	for limit := ownerProbe; ; {
		var (
			recs  []claim.Record
			err   error
			now   time.Time // the backend's clock as of the read, or before
			paged bool
		)
		if limit == ownerProbe && *page != nil {
			recs, now, paged = pageAt(*page, cl, j.fire(cl.Run.At))
			*page = nil
		}
		if !paged {
			now = backendNow()
			pctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
			recs, err = d.reads.history(pctx, j.Name, limit)
			cancel()
		}
		if err == nil {
			recs = withHeldHere(recs, j, cl)
			// Every replica must order two runs alike, so this run's own
			// record, which they read too, places it where it is found;
			// the grant's reply, only where it is not (not yet listed).
			mine := firstChance(j.fire(cl.Run.At), grantedAt)
			for _, rec := range recs {
				if rec.RunID == cl.ID() && rec.Fence == cl.Fence {
					mine = firstChance(j.fire(cl.Run.At), rec.StartedAt)
				}
			}
			var p probe
			for _, rec := range recs {
				if rec.RunID != cl.ID() && rec.Status.Live() && rec.At.Before(cl.Run.At) && !j.isLive(rec.At) {
					p.unwatched = append(p.unwatched, rec)
				}
				if rec.RunID == cl.ID() || rec.Status != claim.Running || !rec.LeaseUntil.After(now) {
					continue
				}
				if rec.At.After(cl.Run.At) && (p.newer == nil || rec.At.After(p.newer.At)) {
					p.newer = &rec
				}
				switch theirs := firstChance(j.fire(rec.At), rec.StartedAt); {
				case theirs.Before(mine) || theirs.Equal(mine) && rec.Fence < cl.Fence:
					p.owners = append(p.owners, rec)
				case rec.Fence < cl.Fence && p.ahead == nil:
					p.ahead = &rec
				}
			}
			if len(recs) == limit && limit < maxOwnerProbe {
				if oldest := recs[len(recs)-1]; !ranAndEnded(oldest) || watchedBeyond(j, cl, oldest.At) {
					limit *= 8
					continue
				}
			}
			slices.SortFunc(p.owners, func(a, b claim.Record) int {
				return cmp.Or(firstChance(j.fire(a.At), a.StartedAt).Compare(firstChance(j.fire(b.At), b.StartedAt)), cmp.Compare(a.Fence, b.Fence))
			})
			return p, nil
		}
		switch {
		case failing.IsZero():
			failing = time.Now()
		case !warned && time.Since(failing) >= r.opts.RenewEvery:
			warned = true
			r.opts.Logger.WarnContext(ctx, "cannot read the job's history; the run waits to start",
				append(runAttrs(r, cl.Run, cl), "error", err.Error())...)
		}
		if local := r.opts.Now(); cl.Attempt == 1 && r.pastDeadline(j, cl.Run, local) && !j.runsLate(cl.Run.At, local) {
			return probe{}, fmt.Errorf("%w: %w", errMissedWaiting, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done(): // the lease could not be kept meanwhile
			t.Stop()
			return probe{}, fmt.Errorf("overlap probe: %w (%w)", context.Cause(ctx), err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// pageAt returns page, a grant's, and the backend's time of the grant
// as its own record there gives it (StartedAt: no later than the page
// was read), if the grant came no earlier than fire, the run's instant.
// ok is false if it came earlier, or the page lacks the grant's record.
func pageAt(page []claim.Record, cl *claim.Claim, fire time.Time) (recs []claim.Record, at time.Time, ok bool) {
	for _, rec := range page {
		if rec.RunID == cl.ID() && rec.Fence == cl.Fence {
			return page, rec.StartedAt, !rec.StartedAt.Before(fire)
		}
	}
	return nil, time.Time{}, false
}

// errMissedWaiting ends the wait of a scheduled run whose owners could
// not be read before its deadline: it is recorded missed, cause
// backend_unavailable.
var errMissedWaiting = errors.New("runner: the job's history could not be read before the run's deadline")

// withHeldHere adds to recs, a page of j's newest runs, the runs of j
// this replica executes (other than cl) that the page does not list. The
// page may miss a live run: a run whose holder died, and whose lease
// lapsed, does not keep later instants from running, and once taken over
// it is live again behind runs that ran and ended, deeper than the probe
// reads (explorer seed 61163: two takeovers, the older beyond the newer's
// page, started side by side). Such a run is counted where it executes,
// and found where it is watched (watchedBeyond). Its record is the
// grant's: live until it ends here (a lost lease ends it soon after),
// placed by its grant.
//
// A run the page lists as this replica's grant, still running, is live
// while this replica trusts its lease, whatever lease the page shows: a
// server gone back to an older copy of its data shows the lease as of
// the copy, lapsed, while its holder renewed it since and executes on.
// Believing the page, a replica started the job's next run beside the
// one it executed itself (the explorer's job-overlap on Redis, seed
// 50000029, under a rewind). Its holder learns of the loss at its next
// renewal, and the run then ends. Once this replica no longer trusts
// the lease (earlierLive), the page is believed.
func withHeldHere(recs []claim.Record, j *jobState, cl *claim.Claim) []claim.Record {
	held := j.heldHere(cl.ID())
	if len(held) == 0 {
		return recs
	}
	listed := make(map[string]int, len(recs))
	for i, rec := range recs {
		listed[rec.RunID] = i
	}
	// The page is shared: the reader answers the probes of one job that
	// were queued together with one read (found by the race detector, two
	// probes appending to one page at once). Changed, it is copied.
	recs = slices.Clone(recs)
	for _, h := range held {
		rec := h.rec
		i, ok := listed[rec.RunID]
		switch {
		case !ok:
			rec.LeaseUntil = liveHere
			recs = append(recs, rec)
		case recs[i].Fence == rec.Fence && recs[i].Status == claim.Running && h.isTrusted():
			recs[i].LeaseUntil = liveHere
		}
	}
	return recs
}

// liveHere is the lease withHeldHere gives a run this replica executes:
// renewed until it ends here.
var liveHere = time.Unix(1<<40, 0)

// watchedBeyond reports whether this replica stands by for a run of j
// before cl's that is older than oldest, the oldest run of the page the
// probe read: a run held elsewhere that the page does not reach. Behind
// runs that ran and ended is where a run taken over after its lease
// lapsed lives on (see withHeldHere); where this replica watches it, the
// probe reads deeper and finds its record, placed as its holder places
// it, rather than count it blindly (which could have two runs wait for
// each other).
func watchedBeyond(j *jobState, cl *claim.Claim, oldest time.Time) bool {
	_, watched := j.earlierLive(cl.Run.At)
	for _, at := range watched {
		if at.Before(oldest) {
			return true
		}
	}
	return false
}

func callHandler(ctx context.Context, h job.Handler, run job.Run) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, run)
}
