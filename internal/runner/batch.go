package runner

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// maxBatch bounds one ClaimBatch or ReleaseBatch call.
const maxBatch = 1000

// nextBatch takes the next batch from pending, in order: at most maxBatch
// calls, of distinct runs (a batch names each run once, as ClaimBatch and
// ReleaseBatch require); the rest stays pending.
func nextBatch[T any](pending []T, runID func(T) string) (batch, rest []T) {
	seen := map[string]bool{}
	for _, x := range pending {
		if id := runID(x); len(batch) < maxBatch && !seen[id] {
			seen[id] = true
			batch = append(batch, x)
		} else {
			rest = append(rest, x)
		}
	}
	return batch, rest
}

// queue is the group-commit state batcher and releaser share: the calls
// waiting for the next batch, and whether a sender is at work.
type queue[T any] struct {
	runID func(T) string

	mu      sync.Mutex
	pending []T
	busy    bool // a sender is at work
}

// add queues x and reports whether the caller must start sending: no
// sender was at work (it is now).
func (q *queue[T]) add(x T) (lead bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(q.pending, x)
	lead = !q.busy
	q.busy = true
	return lead
}

// take returns the next batch (see nextBatch). When nothing is waiting it
// returns none and the sender stops: the next add leads.
func (q *queue[T]) take() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	var batch []T
	batch, q.pending = nextBatch(q.pending, q.runID)
	if len(batch) == 0 {
		q.busy = false
	}
	return batch
}

// idle reports whether nothing is waiting, and if so stops the sender.
func (q *queue[T]) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) == 0 {
		q.busy = false
		return true
	}
	return false
}

// batcher coalesces one Run's claim calls into ClaimBatch calls when the
// claimer is a claim.BatchClaimer: a bid that finds no batch in flight goes
// out at once, alone; bids that arrive while one is in flight wait for it
// and go out together in the next (group commit). So a lone run costs what
// Claim costs, and 10,000 runs due at one instant cost a few round trips.
//
// The goroutine sending batches is started by the first bid that finds none
// running, under the dispatcher's standby group, and exits as soon as no bid
// is waiting.
type batcher struct {
	c claim.BatchClaimer
	d *dispatcher
	q queue[*bid]
}

// bid is one claim call waiting for its batch.
type bid struct {
	run   claim.Run
	state atomic.Int32 // bidWaiting, then bidAnswered or bidAbandoned
	done  chan struct{}
	cl    *claim.Claim
	err   error
}

const (
	bidWaiting = iota
	bidAnswered
	bidAbandoned
)

// claim bids for run in the next batch and waits for its answer, or for
// Run's ctx: a grant that comes after its bidder left is handed back.
func (b *batcher) claim(run claim.Run) (*claim.Claim, error) {
	x := &bid{run: run, done: make(chan struct{})}
	if b.q.add(x) {
		b.d.standby.Go(b.send)
	}
	select {
	case <-x.done:
	case <-b.d.ctx.Done():
		if x.state.CompareAndSwap(bidWaiting, bidAbandoned) {
			return nil, b.d.ctx.Err()
		}
		<-x.done // answered meanwhile
	}
	return x.cl, x.err
}

// send sends batches until no bid is waiting.
func (b *batcher) send() {
	r := b.d.r
	for {
		// A run bid for twice (a standby and an overlap probe) waits for
		// the next batch.
		batch := b.q.take()
		if len(batch) == 0 {
			return
		}

		runs := make([]claim.Run, len(batch))
		for i, x := range batch {
			runs[i] = x.run
		}
		// As for a single claim: past a third of the lease the answer is
		// treated as lost, and a grant in flight simply expires.
		ctx, cancel := context.WithTimeout(b.d.ctx, r.opts.Lease/3)
		start := time.Now()
		cls, errs := b.c.ClaimBatch(ctx, runs, r.opts.Lease)
		cancel()
		took := time.Since(start)
		for i, x := range batch {
			r.opts.Metrics.claimed(x.run.Job, r.opts.ClaimerName, errs[i], took)
			x.cl, x.err = cls[i], errs[i]
			if x.state.CompareAndSwap(bidWaiting, bidAnswered) {
				close(x.done)
			} else if cls[i] != nil {
				b.handBack(cls[i])
			}
		}
	}
}

// handBack releases a grant nobody waits for any more as interrupted, so
// that another replica can take the run at once.
func (b *batcher) handBack(cl *claim.Claim) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.d.ctx), b.d.r.opts.Lease/3)
	defer cancel()
	_ = b.d.r.opts.Claimer.Release(ctx, cl, claim.Interrupted) // best effort: the lease bounds the rest
}

// releaser coalesces one Run's release calls into ReleaseBatch calls when
// the claimer is a claim.BatchReleaser, by group commit as batcher does for
// claims: when 10,000 runs finish at once, their releases cost a few round
// trips instead of 10,000 calls queued for the pool.
//
// There is no sending goroutine of its own: the release that finds none in
// flight sends its batch itself, and if releases queued up meanwhile it
// hands on to a new goroutine of the exec group, so nobody waits for
// batches other than its own. Adding to exec there is safe: releases come
// from exec goroutines, whose own count keeps exec above zero, or from
// standby goroutines, which Run waits for before it waits for exec.
type releaser struct {
	c claim.BatchReleaser
	d *dispatcher
	q queue[*ending]
}

// ending is one release call waiting for its batch.
type ending struct {
	cl   *claim.Claim
	o    claim.Outcome
	done chan struct{}
	err  error
}

// release ends cl with o in the next batch and returns its answer. A batch
// is bounded by a third of the lease, as a claim is; the caller retries.
func (b *releaser) release(cl *claim.Claim, o claim.Outcome) error {
	x := &ending{cl: cl, o: o, done: make(chan struct{})}
	if b.q.add(x) {
		b.send(x)
	}
	<-x.done
	return x.err
}

// send sends batches until own is answered (or, with own nil, until none
// is waiting), then hands what is still waiting to an exec goroutine.
func (b *releaser) send(own *ending) {
	for {
		batch := b.q.take()
		if len(batch) == 0 {
			return
		}

		cls, outs := make([]*claim.Claim, len(batch)), make([]claim.Outcome, len(batch))
		for i, x := range batch {
			cls[i], outs[i] = x.cl, x.o
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(b.d.execCtx), b.d.r.opts.Lease/3)
		errs := b.c.ReleaseBatch(ctx, cls, outs)
		cancel()
		answered := false
		for i, x := range batch {
			x.err = errs[i]
			answered = answered || x == own
			close(x.done)
		}
		if answered {
			if !b.q.idle() {
				b.d.exec.Go(func() { b.send(nil) })
			}
			return
		}
	}
}
