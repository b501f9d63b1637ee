// This file owns ending runs: release retries until the backend answers
// (or a lease after shutdown), and releaser coalesces the release calls of
// one Run into batches (group commit, on batch.go's queue).

package runner

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// release ends cl with o, retrying transient failures until the backend
// answers (the keep-alive, where one runs, holds the lease meanwhile): a
// lost release would let the run be executed again, and a release that
// lands after an outage still ends the run if nobody took it over.
// Release compares the token, so a retry past a takeover is refused,
// never applied. Once Run is shutting down (ctx, Run's, is done) it gives
// up after a lease; the calls themselves are detached from ctx.
func (d *dispatcher) release(ctx context.Context, cl *claim.Claim, o claim.Status) error {
	r := d.r
	backoff := 50 * time.Millisecond
	var giveUp <-chan time.Time
	for logged := false; ; {
		err := d.ends.release(ctx, cl, o)
		if err == nil || errors.Is(err, claim.ErrLeaseLost) || errors.Is(err, claim.ErrInvalid) {
			return err
		}
		if !logged {
			r.log.ErrorContext(ctx, "release failed; retrying", append(runAttrs(r, cl.Run, cl), "outcome", string(o), "error", err.Error())...)
			logged = true
		}
		if giveUp == nil && ctx.Err() != nil {
			t := time.NewTimer(r.opts.Lease)
			defer t.Stop()
			giveUp = t.C
		}
		shutdown := ctx.Done()
		if giveUp != nil {
			shutdown = nil // already counting down
		}
		t := time.NewTimer(backoff)
		select {
		case <-giveUp:
			t.Stop()
			r.log.ErrorContext(ctx, "release failed", append(runAttrs(r, cl.Run, cl), "outcome", string(o), "error", err.Error())...)
			d.unconfirmed.Add(1)
			return err
		case <-shutdown:
			t.Stop()
		case <-t.C:
		}
		// At most a quarter lease apart: after an outage, a standby
		// holds its takeovers back for a lease once the backend answers
		// (claim.Unanswered), and this retry must land within it. At a
		// second, a lease under a second left the race to chance.
		backoff = min(2*backoff, time.Second, max(r.opts.Lease/4, 50*time.Millisecond))
	}
}

// releaser coalesces one Run's release calls into batches, by group
// commit as batcher does for claims: when 10,000 runs finish at once,
// their releases cost a few round trips instead of 10,000 calls queued
// for the pool.
//
// There is no sending goroutine of its own: the release that finds none in
// flight sends its batch itself, and if releases queued up meanwhile it
// hands on to a new goroutine of the exec group, so nobody waits for
// batches other than its own. Adding to exec there is safe: releases come
// from exec goroutines, whose own count keeps exec above zero, or from
// standby goroutines, which Run waits for before it waits for exec.
type releaser struct {
	d *dispatcher
	q queue[*ending]
}

// ending is one release call waiting for its batch.
type ending struct {
	cl   *claim.Claim
	o    claim.Status
	done chan struct{}
	err  error
	span trace.SpanContext // the run's span, when traced: the batch links to it
}

// release ends cl with o in the next batch and returns its answer. A batch
// is bounded by a lease, so that a slow link does not turn every try into
// a timeout while the keep-alive holds the lease; the caller retries.
func (b *releaser) release(ctx context.Context, cl *claim.Claim, o claim.Status) error {
	x := &ending{cl: cl, o: o, done: make(chan struct{})}
	if b.d.r.opts.Tracer != nil {
		x.span = trace.SpanContextFromContext(ctx)
	}
	if b.q.add(x) {
		b.send(ctx, x, b.stuck())
	}
	<-x.done
	return x.err
}

// send sends batches until own is answered (or, with own nil, until none
// is waiting), then hands what is still waiting to an exec goroutine. The
// calls are detached from ctx: it lends them its values only, and a lease
// bounds each batch.
func (b *releaser) send(ctx context.Context, own *ending, stuck time.Duration) {
	for {
		batch := b.q.take()
		if len(batch) == 0 {
			return
		}

		cls, outs := make([]*claim.Claim, len(batch)), make([]claim.Status, len(batch))
		var links []trace.Link
		for i, x := range batch {
			cls[i], outs[i] = x.cl, x.o
			if x.span.IsValid() {
				links = append(links, trace.Link{SpanContext: x.span})
			}
		}
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.d.r.opts.Lease)
		// A batch of its own, not a child of the run whose release leads
		// it (ctx's): it links every run it releases instead.
		bctx, span := b.d.r.startBatch(bctx, "release batch", len(batch), trace.WithNewRoot(), trace.WithLinks(links...))
		spill := b.spillAfter(ctx, stuck)
		errs := b.d.r.opts.Claimer.Release(bctx, cls, outs)
		spill()
		cancel()
		endBatch(span, attrBatchDone, errs, claim.ErrLeaseLost, claim.ErrInvalid)
		answered := false
		for i, x := range batch {
			x.err = errs[i]
			answered = answered || x == own
			close(x.done)
		}
		if answered {
			if !b.q.idle() {
				b.d.exec.Go(func() { b.send(ctx, nil, b.stuck()) })
			}
			return
		}
	}
}

// stuck is how long a release batch may be out before the releases
// behind it go without it (spillAfter): far above a healthy round trip.
func (b *releaser) stuck() time.Duration { return min(b.d.r.opts.Lease/10, 200*time.Millisecond) }

// spillAfter starts, should the batch about to go not come back within
// stuck, another sender for the releases waiting behind it, and returns
// what to call once the batch came back. A backend that stalls holds the
// batch in flight, and every release after it waited in this process: a
// replica killed meanwhile lost them all, and each of those runs, its
// handler done, ran again once the lease lapsed (an outside review: 79
// runs after a 6s Redis stop, a replica killed 1s into it). Sent, a
// release waits in the backend's socket and lands when it resumes,
// whatever became of this process. (The Redis claimers' own merging lets
// such a batch by too: claim.ReleaseCoalescer.) The next sender, stuck
// in turn, spills after half as long again: each holds a connection of
// the client's pool for the stall, and a release that waits for one
// waits in this process too.
func (b *releaser) spillAfter(ctx context.Context, stuck time.Duration) (back func()) {
	var mu sync.Mutex
	came := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(stuck, func() {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case came:
		case b.q.spill():
			// The batch's sender, an exec goroutine, is still at work,
			// so exec is above zero (see releaser).
			b.d.exec.Go(func() { b.send(ctx, nil, stuck*3/2) })
		default:
			t.Reset(stuck) // nothing waits yet: look again
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		came = true
		t.Stop()
	}
}
