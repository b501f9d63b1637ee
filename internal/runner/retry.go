// This file owns retries inside one run: a handler that failed or timed
// out hands its run on to a next attempt after a backoff, instead of
// ending it failed, until the job's max_attempts grants were spent.
//
// No backend needed a new operation. The holder does not release the run:
// it cuts its lease to end when the backoff does, and stops renewing it.
// Until then the run is held (no replica takes it earlier, and later
// instants meet it under their overlap policy as they would meet a
// running one); then the lease lapses, and whichever replica claims the
// run next takes it over as attempt+1, with a higher fence: the path of
// a takeover after a crash. That is also why retries and takeovers share
// one attempt count, and why a holder that dies during the backoff loses
// nothing: the lease lapses all the same.

package runner

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// retries reports whether a failed attempt of j is retried.
func (j *jobState) retries(attempt int) bool { return j.Backoff > 0 && attempt < j.MaxAttempts }

// backoff is the wait after attempt failed before the next may start:
// Backoff, doubled per attempt, at most MaxBackoff. It is the same on
// every replica, so the history says when a retry was due.
func (j *jobState) backoff(attempt int) time.Duration {
	b := j.Backoff
	for i := 1; i < attempt && b < j.MaxBackoff; i++ {
		b *= 2
	}
	return min(b, j.MaxBackoff)
}

// recordAttempt remembers a failed attempt of a job that retries, so the
// history can show every attempt (the backend's run record keeps only
// the latest). It is bounded and best effort: a lost record costs the
// operator a line of history, never the run. retryAt is zero for the last
// attempt.
func (d *dispatcher) recordAttempt(ctx context.Context, j *jobState, cl *claim.Claim, status claim.Status, started time.Time, herr error, retryAt time.Time) {
	r := d.r
	if r.opts.Controls == nil || j.Backoff <= 0 {
		return
	}
	a := control.Attempt{RunID: cl.ID(), Attempt: cl.Attempt, Fence: cl.Fence, Holder: r.opts.Instance,
		Status: status, Started: started.UTC(), Ended: r.opts.Now().UTC(), RetryAt: retryAt}
	if herr != nil {
		a.Error = herr.Error()
	}
	// Not cut short by a shutdown: an attempt that fails within the grace
	// is retried, and its record is the only trace of it (an outside
	// review: every rolling deploy that caught a failing attempt lost it).
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.Lease/3)
	defer cancel()
	if err := r.opts.Controls.RecordAttempt(wctx, a); err != nil {
		r.log.WarnContext(ctx, "cannot record the failed attempt", append(runAttrs(r, cl.Run, cl), "error", err.Error())...)
	}
}

// recordEnded remembers an attempt that ended without the run's record
// saying so, as recordAttempt does a failed one: handed back at a
// shutdown (interrupted), or run while its release was refused, the run
// taken over (lease_lost). It ended at ended, when its handler returned,
// and ran is how long its handler ran (0: it did not start). Best effort.
//
// A hand-back is counted by handBacks: a run's takeovers count against
// max_attempts (a run that kills its process every time must not loop
// for good), but an attempt a deploy stopped did not fail and did not
// crash (an outside review: three rolling restarts during a long run
// failed it, "attempt 4 exceeds max_attempts 3"). One not recorded
// counts as a crash.
func (d *dispatcher) recordEnded(ctx context.Context, cl *claim.Claim, status claim.Status, ended time.Time, ran time.Duration, why error) {
	r := d.r
	if r.opts.Controls == nil {
		return
	}
	a := control.Attempt{RunID: cl.ID(), Attempt: cl.Attempt, Fence: cl.Fence, Holder: r.opts.Instance,
		Status: status, Started: ended.Add(-ran), Ended: ended, Error: why.Error()}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.Lease/3)
	defer cancel()
	if err := r.opts.Controls.RecordAttempt(wctx, a); err != nil {
		r.log.WarnContext(ctx, "cannot record the ended attempt", append(runAttrs(r, cl.Run, cl), "status", string(status), "error", err.Error())...)
	}
}

// withinAttempts reports whether cl's attempt is within j's max_attempts
// once the attempts handed back at a shutdown before it are not counted
// (recordEnded). Read only for an attempt past max_attempts: a
// register read per such takeover. A read that fails counts them all.
func (d *dispatcher) withinAttempts(ctx context.Context, j *jobState, cl *claim.Claim) bool {
	if cl.Attempt <= j.MaxAttempts {
		return true
	}
	r := d.r
	if r.opts.Controls == nil {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
	defer cancel()
	atts, err := r.opts.Controls.Attempts(rctx, cl.ID()+"/")
	if err != nil {
		return false
	}
	handedBack := 0
	for _, a := range atts {
		if a.RunID == cl.ID() && a.Status == claim.Interrupted && a.Attempt < cl.Attempt {
			handedBack++
		}
	}
	return cl.Attempt-handedBack <= j.MaxAttempts
}

// backoffLeft is how long cl, a later attempt of a job that retries,
// must still wait before it starts: until the latest retry time the
// attempts before it recorded (recordAttempt), on this replica's clock,
// and never longer than the backoff after the attempt before it. The
// lease is the backoff only where its holder could set it so; where it
// could not (the backend out of reach just then, or the holder died
// after recording the attempt), the lease lapses at its last deadline,
// sooner than a backoff longer than the lease, and the run is taken over
// early. A failed read waits for nothing: that costs the backoff, never
// the run. One register read per takeover of such a job, where the
// backoff outlasts what a lapsed lease leaves.
func (d *dispatcher) backoffLeft(ctx context.Context, j *jobState, cl *claim.Claim) time.Duration {
	r := d.r
	if cl.Attempt <= 1 || j.Backoff <= 0 || r.opts.Controls == nil {
		return 0
	}
	if j.backoff(cl.Attempt-1) <= r.opts.Lease-r.opts.RenewEvery {
		// A lease left to lapse ends no sooner than a lease less a
		// renewal period after the attempt failed (its last renewal
		// came at most that long before), past such a backoff: no read.
		return 0
	}
	rctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
	defer cancel()
	atts, err := r.opts.Controls.Attempts(rctx, cl.ID()+"/")
	if err != nil {
		return 0
	}
	var due time.Time
	for _, a := range atts {
		if a.RunID == cl.ID() && a.Attempt < cl.Attempt && a.RetryAt.After(due) {
			due = a.RetryAt
		}
	}
	if due.IsZero() {
		return 0
	}
	return min(due.Sub(r.opts.Now()), j.backoff(cl.Attempt-1))
}

// retryLater ends a failed attempt by cutting cl's lease to the backoff
// (see the file comment). The keep-alive must have stopped: it would
// renew the lease to a full one again. It returns Retrying, or LeaseLost
// if the run was no longer this replica's to hand on. ctx is Run's.
func (d *dispatcher) retryLater(ctx context.Context, j *jobState, cl *claim.Claim, status claim.Status, elapsed time.Duration, herr error) claim.Status {
	r := d.r
	wait := j.backoff(cl.Attempt)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.Lease/3)
	err := r.opts.Claimer.Renew(rctx, cl, wait)
	cancel()
	attrs := append(runAttrs(r, cl.Run, cl), "status", status, "duration_ms", elapsed.Milliseconds())
	if herr != nil {
		attrs = append(attrs, "error", herr.Error())
	}
	switch {
	case errors.Is(err, claim.ErrLeaseLost):
		// Taken over meanwhile: the new holder is the next attempt.
		d.finished(ctx, cl, claim.LeaseLost, elapsed, errors.Join(herr, err))
		return claim.LeaseLost
	case err != nil:
		// The lease could not be set to the backoff: it lapses at its
		// last deadline, and whoever takes the run over then waits for
		// the rest of the backoff the attempt's record names
		// (backoffLeft).
		attrs = append(attrs, "cut_error", err.Error())
	}
	attrs = append(attrs, "retry_in_ms", wait.Milliseconds(), "retry_at", r.opts.Now().Add(wait).UTC().Format(time.RFC3339Nano))
	r.opts.Logger.Log(ctx, slog.LevelWarn, "run failed; retry scheduled", attrs...)
	r.opts.Metrics.finished(cl.Run.Job, claim.Retrying, elapsed)
	r.emit(Event{Kind: EventFinished, Run: cl.Run, Claim: cl, Status: claim.Retrying, Err: herr, Ran: elapsed})
	return claim.Retrying
}
