// This file owns the lease of an executing run: keepAlive renews it from
// the handler's start until its release has landed, and cancels the
// handler when it can no longer be trusted (trustMargin).

package runner

import (
	"context"
	"errors"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// keepAlive renews cl every RenewEvery until ctx is done. While the handler
// runs (run is not done), a refused renewal, or a trust window that passes
// before one succeeds, cancels the run with cause ErrLeaseLost. The window is
// measured on the monotonic clock from the moment the last successful
// request was sent. Once the handler has returned, keepAlive only keeps the
// lease up for the release, and leaves the verdict to it.
//
// ctx is detached from Run's ctx and from execCtx: neither shutdown nor
// the end of ShutdownGrace stops it, only execute once the release has
// landed. run is the execution's context, which cancel cancels.
//
// keepAlive is the only reader and writer of cl's lease fields (Deadline,
// Requested, Lease) while it runs; Release reads only the immutable ones.
func (d *dispatcher) keepAlive(ctx, run context.Context, cl *claim.Claim, cancel context.CancelCauseFunc) {
	r := d.r
	margin := r.trustMargin()
	// Renewals are timed from when the lease's last request left
	// (Requested), not from when its reply came back: on a slow link a
	// grant arrives a round trip late, and a renewal sent RenewEvery after
	// that would have a round trip less before the trust window closes
	// (at 900ms round trips on a 3s lease, none: it came back too late
	// every time, and a long run was cancelled though its lease held).
	next := time.NewTimer(time.Until(cl.Requested.Add(r.opts.RenewEvery)))
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
			next.Reset(max(time.Until(cl.Requested.Add(r.opts.RenewEvery)), r.opts.RenewEvery/10))
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
