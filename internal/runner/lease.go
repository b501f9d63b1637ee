// This file owns the lease of an executing run: keepAlive renews it from
// the handler's start until its release has landed, and cancels the
// handler when it can no longer be trusted (trustMargin).

package runner

import (
	"context"
	"errors"
	"sync/atomic"
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
func (d *dispatcher) keepAlive(ctx, run context.Context, cl *claim.Claim, cancel context.CancelCauseFunc, trust *atomic.Pointer[time.Time]) {
	r := d.r
	margin := r.trustMargin()
	next := time.NewTimer(r.renewIn(cl))
	defer next.Stop()
	lost := func(msg string, attrs ...any) {
		trust.Store(nil)
		if run.Err() == nil {
			r.opts.Logger.WarnContext(ctx, msg, append(runAttrs(r, cl.Run, cl), attrs...)...)
			cancel(claim.ErrLeaseLost)
		}
	}
	for {
		trusted := cl.TrustedUntil(margin)
		trust.Store(&trusted)
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
			next.Reset(r.renewIn(cl))
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

// renewIn is when to renew cl next, from a moment its last grant or
// renewal has just come back: RenewEvery from now, but no later than
// leaves that request's round trip, and the trust margin again, before
// the trust window closes. On a fast link that is RenewEvery. On a slow
// one the window is measured from when the request left (Requested), a
// round trip before its reply came: a renewal sent RenewEvery after the
// reply came back after the window (at 900ms round trips on a 3s lease,
// every time), and a long run was cancelled though its lease held.
// Renewing sooner than needed costs the backend a round trip's work per
// renewal, so the cap is as late as is safe, not RenewEvery from
// Requested.
func (r *Runner) renewIn(cl *claim.Claim) time.Duration {
	margin := r.trustMargin()
	rtt := time.Since(cl.Requested)
	latest := time.Until(cl.TrustedUntil(margin)) - rtt - margin
	// The floor keeps a claimer that does not date its renewals anew
	// (Requested; the conformance suite checks it) from renewing in a
	// busy loop.
	return max(min(r.opts.RenewEvery, latest), 10*time.Millisecond)
}
