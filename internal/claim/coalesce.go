package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Coalescer merges concurrent calls of a batch operation into fewer
// batches, by group commit: a call made while none is in flight goes at
// once, alone; calls made while one is in flight wait, and when it
// returns, all of them go as one batch. No call waits on a timer, so a
// lone caller pays nothing, and callers who come together (a backend is
// the bottleneck) share round trips and the server's per-call costs. The
// zero value is ready to use; a Coalescer must not be copied.
//
// The runner already hands a claimer its due runs in batches; this is for
// the callers who do not, such as an application calling Claim from many
// goroutines.
type Coalescer[In, Out any] struct {
	mu    sync.Mutex
	busy  bool      // a batch is in flight
	since time.Time // when it was sent
	queue []*waiter[In, Out]
	sends Stragglers // batches sent on a goroutine of their own (Wait)
}

type waiter[In, Out any] struct {
	ctx     context.Context
	in      []In
	out     []Out
	abandon func([]Out)   // given out if the caller left while its batch was in flight
	lead    chan struct{} // closed: this waiter sends the next batch
	done    chan struct{} // closed: out is set, or the waiter was left out
	// state settles, once, whether the caller takes out (delivered) or
	// left while its batch was in flight (abandoned): then the batch's
	// sender hands out to the waiter's abandon.
	state atomic.Int32
}

const (
	waiting int32 = iota
	delivered
	abandoned
)

// Do calls send with in, merged with the inputs of other calls waiting
// at the time, and returns this call's share of the outputs (send must
// return one output per input, in order).
//
// send's context carries the values of one caller's ctx, the latest of
// the callers' deadlines (none if one of them has none), and is cancelled
// only once every merged caller's ctx is done: one caller giving up does
// not fail the others' share. A caller whose ctx ends returns at once,
// with nil outputs: one still waiting for a batch to go is left out of
// it; one whose batch is in flight leaves its share to abandon (if not
// nil), called once the batch returns, on the goroutine that sent it, so
// that what the share did can be undone (a claim granted to a caller
// that left). abandon must not call back into the Coalescer: the next
// batch waits for it.
func (c *Coalescer[In, Out]) Do(ctx context.Context, in []In, send func(ctx context.Context, in []In) []Out, abandon func(out []Out)) []Out {
	return c.do(ctx, in, send, abandon, 0)
}

// do is Do, but a call made while the batch in flight has been out for
// longer than stuck (if stuck > 0) goes at once, alone, beside it.
func (c *Coalescer[In, Out]) do(ctx context.Context, in []In, send func(ctx context.Context, in []In) []Out, abandon func(out []Out), stuck time.Duration) []Out {
	w := &waiter[In, Out]{ctx: ctx, in: in, abandon: abandon, lead: make(chan struct{}), done: make(chan struct{})}
	c.mu.Lock()
	if c.busy && stuck > 0 && time.Since(c.since) > stuck {
		c.mu.Unlock()
		return send(ctx, in)
	}
	if c.busy {
		c.queue = append(c.queue, w)
		c.mu.Unlock()
		select {
		case <-w.done:
			return w.take()
		case <-w.lead:
		case <-ctx.Done():
			if c.leave(w) {
				return nil
			}
			return c.await(w) // already in a batch on its way
		}
		c.mu.Lock()
	}
	// This caller sends: alone, or for everyone queued behind the batch
	// that just returned (itself among them).
	c.busy, c.since = true, time.Now()
	batch := c.queue
	c.queue = nil
	c.mu.Unlock()
	if len(batch) == 0 {
		batch = []*waiter[In, Out]{w}
	}
	// Who goes is decided once: a waiter whose ctx is done now is left
	// out (and returns at once), and so is this caller, which then must
	// not be held sending a batch it is not in.
	var going []*waiter[In, Out]
	mine := false
	for _, x := range batch {
		if x.ctx.Err() != nil {
			close(x.done)
			continue
		}
		going, mine = append(going, x), mine || x == w
	}
	if mine && len(going) == 1 {
		// Alone: the batch's context is this caller's own, so its end
		// cuts the call short.
		defer c.handOn() // even if send panics: a wedged Coalescer would hang every later call
		c.send(going, send)
		return w.take()
	}
	if len(going) > 0 {
		// For others too: sent on a goroutine of its own, so that this
		// caller can leave when its ctx ends without waiting for a batch
		// that runs to the others' deadlines.
		c.sends.Go(func() {
			defer c.handOn()
			c.send(going, send)
		})
	} else {
		c.handOn()
	}
	if !mine {
		return nil
	}
	return c.await(w)
}

// await waits for w's share of the batch it is in, or until its ctx ends:
// then it leaves the share to the batch's sender (abandoned), unless the
// share has come already.
func (c *Coalescer[In, Out]) await(w *waiter[In, Out]) []Out {
	select {
	case <-w.done:
	case <-w.ctx.Done():
		if w.state.CompareAndSwap(waiting, abandoned) {
			return nil
		}
		<-w.done // delivered meanwhile
	}
	return w.take()
}

// take returns w's share once done is closed: nil if it was left out.
func (w *waiter[In, Out]) take() []Out {
	if w.state.Load() == delivered {
		return w.out
	}
	return nil
}

// Wait waits for the batches in flight that no caller waits for (their
// callers left, or the batch went for others): a Claimer's Close calls it
// before it closes its connections, so that what those batches undo
// still reaches the server.
func (c *Coalescer[In, Out]) Wait() { c.sends.Wait() }

// leave takes w out of the queue, if it is still there, handing its turn
// to send on if it had just been given it.
func (c *Coalescer[In, Out]) leave(w *waiter[In, Out]) bool {
	c.mu.Lock()
	i := slices.Index(c.queue, w)
	if i < 0 {
		c.mu.Unlock()
		return false
	}
	c.queue = slices.Delete(c.queue, i, i+1)
	select {
	case <-w.lead:
		c.mu.Unlock()
		c.handOn()
	default:
		c.mu.Unlock()
	}
	return true
}

// handOn gives the turn to send to the first waiter, or ends the busy
// spell if none waits.
func (c *Coalescer[In, Out]) handOn() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) > 0 {
		close(c.queue[0].lead)
	} else {
		c.busy = false
	}
}

// send sends the inputs of the waiters going as one batch and hands each
// its outputs, or, if it left meanwhile, hands them to its abandon.
func (c *Coalescer[In, Out]) send(going []*waiter[In, Out], send func(ctx context.Context, in []In) []Out) {
	if len(going) == 0 {
		return
	}
	all := going[0].in
	if len(going) > 1 {
		all = nil
		for _, w := range going {
			all = append(all, w.in...)
		}
	}
	defer func() {
		for _, w := range going {
			select {
			case <-w.done:
			default:
				close(w.done) // send panicked: nobody waits for ever
			}
		}
	}()
	ctx := going[0].ctx // one caller: its own context is the merged one
	if len(going) > 1 {
		var cancel context.CancelFunc
		ctx, cancel = mergedContext(going)
		defer cancel()
	}
	out := send(ctx, all)
	var gone []*waiter[In, Out]
	for _, w := range going {
		w.out, out = out[:len(w.in):len(w.in)], out[len(w.in):]
		if !w.state.CompareAndSwap(waiting, delivered) {
			gone = append(gone, w)
		}
		close(w.done)
	}
	// After every caller still waiting has its share.
	for _, w := range gone {
		if w.abandon != nil {
			w.abandon(w.out)
		}
	}
}

// mergedContext is the context a batch of several callers is sent
// under (see Do): the first one's values, the latest deadline, and
// cancelled once every caller's ctx is done.
func mergedContext[In, Out any](going []*waiter[In, Out]) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, w := range going {
		d, ok := w.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	base := context.WithoutCancel(going[0].ctx)
	ctx, cancel := context.WithCancel(base)
	if !latest.IsZero() {
		ctx, cancel = context.WithDeadline(base, latest)
	}
	left := atomic.Int64{}
	left.Store(int64(len(going)))
	stops := make([]func() bool, len(going))
	for i, w := range going {
		stops[i] = context.AfterFunc(w.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// Answer is one run's answer to a claim.
type Answer struct {
	Claim *Claim
	Err   error
}

// ClaimCoalescer merges concurrent Claim calls under the same lease
// (calls under different leases never share a batch). The zero value is
// ready to use.
type ClaimCoalescer struct {
	mu sync.Mutex
	// byLease keeps a coalescer for every lease ever asked for, never
	// freed: a runner claims under its one configured lease, so this is
	// one entry, or a few for a process that also triggers and backfills
	// under others.
	byLease map[time.Duration]*Coalescer[Run, Answer]
}

// Claim is a Claimer's Claim through the coalescer: it validates runs and
// lease (CheckClaimBatch), gives send the valid ones (their instants in
// UTC) together with those of other callers waiting at the time, and
// hands back this caller's answers. If ctx ends while its runs are in a
// batch that goes on for others, Claim returns at once, every run
// answering ctx's error, and undo is given what the batch granted to this
// caller once it returns, under a context that outlives ctx (undo bounds
// itself).
func (cc *ClaimCoalescer) Claim(ctx context.Context, runs []Run, lease time.Duration,
	send func(ctx context.Context, runs []Run) []Answer, undo func(ctx context.Context, granted []*Claim)) ([]*Claim, []error) {
	claims := make([]*Claim, len(runs))
	errs, idx := CheckClaimBatch(ctx, runs, lease)
	if len(idx) == 0 {
		return claims, errs
	}
	valid := make([]Run, len(idx))
	for k, i := range idx {
		valid[k] = runs[i]
		valid[k].At = valid[k].At.UTC()
	}
	undoGranted := func(got []Answer) {
		var granted []*Claim
		for _, a := range got {
			if a.Claim != nil {
				granted = append(granted, a.Claim)
			}
		}
		if len(granted) > 0 {
			undo(context.WithoutCancel(ctx), granted)
		}
	}
	got := cc.coalescer(lease).Do(ctx, valid, send, undoGranted)
	if err := ctx.Err(); err != nil || got == nil {
		undoGranted(got) // granted as ctx ended (a caller that left in flight has its grants undone by the batch)
		if err == nil {  // the batch it joined ended without an answer (it panicked)
			err = fmt.Errorf("%w: the merged claim batch gave no answer", ErrUnavailable)
		}
		for _, i := range idx {
			errs[i] = fmt.Errorf("claim %s: %w", runs[i].ID(), err)
		}
		return claims, errs
	}
	for k, i := range idx {
		claims[i], errs[i] = got[k].Claim, got[k].Err
	}
	return claims, errs
}

// Wait is Coalescer.Wait for every lease's batches.
func (cc *ClaimCoalescer) Wait() {
	cc.mu.Lock()
	cos := make([]*Coalescer[Run, Answer], 0, len(cc.byLease))
	for _, co := range cc.byLease {
		cos = append(cos, co)
	}
	cc.mu.Unlock()
	for _, co := range cos {
		co.Wait()
	}
}

func (cc *ClaimCoalescer) coalescer(lease time.Duration) *Coalescer[Run, Answer] {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	co := cc.byLease[lease]
	if co == nil {
		if cc.byLease == nil {
			cc.byLease = map[time.Duration]*Coalescer[Run, Answer]{}
		}
		co = &Coalescer[Run, Answer]{}
		cc.byLease[lease] = co
	}
	return co
}

// Ending is a claim and the outcome it is released with.
type Ending struct {
	Claim   *Claim
	Outcome Status
}

// ReleaseCoalescer merges concurrent Release calls. The zero value is
// ready to use.
//
// A release does not wait behind a batch that has been in flight for
// longer than releaseStuck: it goes at once, beside it. A backend that
// stalls holds that batch, and a release that waited in the process
// behind it was lost with a replica killed during the stall, and its run,
// the handler done, ran again (an outside review: 79 runs after a 6s
// Redis stop, a replica killed 1s into it). Sent, it waits in the
// server's socket and lands when the server resumes.
type ReleaseCoalescer struct{ co Coalescer[Ending, error] }

// releaseStuck is how long a release batch is out before the releases
// that come after it go on their own: far above a healthy round trip.
const releaseStuck = 200 * time.Millisecond

// Wait is Coalescer.Wait.
func (rc *ReleaseCoalescer) Wait() { rc.co.Wait() }

// Release is a Claimer's Release through the coalescer: it validates cls
// and outcomes (CheckReleaseBatch) and gives send the valid ones together
// with those of other callers waiting at the time. A caller whose ctx
// ended before its batch went releases nothing, and every claim answers
// ctx's error.
func (rc *ReleaseCoalescer) Release(ctx context.Context, cls []*Claim, outcomes []Status,
	send func(ctx context.Context, ends []Ending) []error) []error {
	errs, idx := CheckReleaseBatch(cls, outcomes)
	if len(idx) == 0 {
		return errs
	}
	valid := make([]Ending, len(idx))
	for k, i := range idx {
		valid[k] = Ending{cls[i], outcomes[i]}
	}
	got := rc.co.do(ctx, valid, send, nil, releaseStuck) // a release that went cannot be undone: its caller hears ctx's error
	cerr := ctx.Err()
	for k, i := range idx {
		switch {
		case got == nil && cerr != nil:
			errs[i] = fmt.Errorf("release %s as %s: %w", cls[i].ID(), outcomes[i], cerr)
		case got == nil: // the batch it joined ended without an answer (it panicked)
			errs[i] = fmt.Errorf("release %s as %s: %w: the merged release batch gave no answer", cls[i].ID(), outcomes[i], ErrUnavailable)
		case got[k] != nil && cerr != nil && (errors.Is(got[k], context.Canceled) || errors.Is(got[k], context.DeadlineExceeded)):
			// The merged batch was cut short because its callers left:
			// this caller hears why it left.
			errs[i] = fmt.Errorf("release %s as %s: %w", cls[i].ID(), outcomes[i], cerr)
		default:
			errs[i] = got[k]
		}
	}
	return errs
}
