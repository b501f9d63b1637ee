// This file owns group commit: the queue of calls waiting for the next
// batch, which batcher (claims, here), reader (history reads, here) and
// releaser (release.go) share; batcher, which coalesces one Run's claim
// calls; and reader, which coalesces its history reads.

package runner

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// maxBatch bounds one Claim or Release call.
const maxBatch = 1000

// nextBatch takes the next batch from pending, in order: at most maxBatch
// calls, of distinct runs (a batch names each run once, as Claim and
// Release require; run nil: any calls); the rest stays pending.
func nextBatch[T any](pending []T, run func(T) claim.Run) (batch, rest []T) {
	// Runs are told apart by job and instant, as their IDs would tell
	// them, without formatting an ID each (10% of the CPU of 10,000 runs
	// due at once).
	type key struct {
		job string
		at  int64
	}
	seen := map[key]bool{}
	for _, x := range pending {
		if len(batch) == maxBatch {
			rest = append(rest, x)
			continue
		}
		if run != nil {
			r := run(x)
			k := key{r.Job, r.At.UnixNano()}
			if seen[k] {
				rest = append(rest, x)
				continue
			}
			seen[k] = true
		}
		batch = append(batch, x)
	}
	return batch, rest
}

// queue is the group-commit state batcher, reader and releaser share: the calls
// waiting for the next batch, and whether a sender is at work.
type queue[T any] struct {
	run func(T) claim.Run

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
	batch, q.pending = nextBatch(q.pending, q.run)
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

// spill reports whether calls wait behind a sender that is stuck, for
// the caller to start another for them (two then work at once).
func (q *queue[T]) spill() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) > 0
}

// active reports whether calls wait or a sender is at work.
func (q *queue[T]) active() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy || len(q.pending) > 0
}

// batcher coalesces one Run's claim calls into batches: a bid that finds
// no batch in flight goes out at once, alone; bids that arrive while one is
// in flight wait for it and go out together in the next (group commit). So
// a lone run costs one claim, and 10,000 runs due at one instant cost a few
// round trips.
//
// The goroutine sending batches is started by the first bid that finds none
// running, under the dispatcher's standby group, and exits as soon as no bid
// is waiting. It runs under that bid's ctx: every bid of one Run comes with
// Run's ctx (Trigger's with Trigger's), so it is the ctx of all the bids it
// sends.
type batcher struct {
	d *dispatcher
	q queue[*bid]
}

// bid is one claim call waiting for its batch.
type bid struct {
	run   claim.Run
	state atomic.Int32 // bidWaiting, then bidAnswered or bidAbandoned
	// done is closed once the bid is answered; or, for a bid sent
	// without waiting (bidFor), the bid is sent on answers.
	done    chan struct{}
	answers chan<- *bid
	cl      *claim.Claim
	err     error
}

const (
	bidWaiting = iota
	bidAnswered
	bidAbandoned
)

// claim bids for run in the next batch and waits for its answer, or for
// ctx (Run's): a grant that comes after its bidder left is handed back.
func (b *batcher) claim(ctx context.Context, run claim.Run) (*claim.Claim, error) {
	x := &bid{run: run, done: make(chan struct{})}
	if b.q.add(x) {
		b.d.goStandby(func() { b.send(ctx) })
	}
	select {
	case <-x.done:
	case <-ctx.Done():
		if x.state.CompareAndSwap(bidWaiting, bidAbandoned) {
			return nil, ctx.Err()
		}
		<-x.done // answered meanwhile
	}
	return x.cl, x.err
}

// bidFor bids for run in the next batch without waiting for the answer:
// the bid is sent on answers, which must have room for it, once answered.
// Its bidder may give it up with x.state.CompareAndSwap(bidWaiting,
// bidAbandoned); if that fails, the answer is on its way.
func (b *batcher) bidFor(ctx context.Context, run claim.Run, answers chan<- *bid) *bid {
	x := &bid{run: run, answers: answers}
	if b.q.add(x) {
		b.d.goStandby(func() { b.send(ctx) })
	}
	return x
}

// send sends batches until no bid is waiting; ctx (Run's) bounds each.
func (b *batcher) send(ctx context.Context) {
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
		// A batch that takes longer than a third of the lease is treated
		// as failed: replies may still be in flight, so their runs stay
		// held until the lease expires and are then taken over, never run
		// twice.
		bctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
		// Each grant's page saves its overlap probe a read (see owners):
		// asked for on every batch, since runs of any policy probe when
		// caught up in turn.
		bctx = claim.WithPages(bctx)
		bctx, span := r.startBatch(bctx, "claim batch", len(runs))
		start := time.Now()
		cls, errs := r.opts.Claimer.Claim(bctx, runs, r.opts.Lease)
		cancel()
		endBatch(span, attrBatchWon, errs, claim.ErrHeld, claim.ErrDone)
		took := time.Since(start)
		for i, x := range batch {
			r.opts.Metrics.claimed(x.run.Job, r.opts.ClaimerName, errs[i], took)
			x.cl, x.err = cls[i], errs[i]
			if !x.state.CompareAndSwap(bidWaiting, bidAnswered) {
				if cls[i] != nil {
					b.handBack(ctx, cls[i])
				}
			} else if x.answers != nil {
				x.answers <- x
			} else {
				close(x.done)
			}
		}
	}
}

// handBack releases a grant nobody waits for any more as interrupted, so
// that another replica can take the run at once. The call is detached
// from ctx (its bidder left because ctx ended) and bounded by Lease/3.
// (A process outside the fleet named the run in the register before it
// bid: see carrier.)
func (b *batcher) handBack(ctx context.Context, cl *claim.Claim) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.d.r.opts.Lease/3)
	defer cancel()
	_ = claim.ReleaseOne(hctx, b.d.r.opts.Claimer, cl, claim.Interrupted) // best effort: the lease bounds the rest
}

// reader coalesces one Run's history reads into batches (claim.Histories),
// as batcher does claims: the overlap probes of 10,000 runs granted at
// once cost a few reads instead of 10,000.
//
// A read is answered only by a batch sent after it was queued, never by
// one already in flight: it sees every grant that was visible when it was
// asked for, which is all the overlap probe's ordering argument assumes
// of a read (see owners). Reads of the same job and limit queued together
// share one query; a read whose caller left is not sent. The batch goes
// out from a goroutine of the exec group, as releaser's do and for the
// same reason it is safe: reads come from exec goroutines (the probes).
type reader struct {
	d *dispatcher
	q queue[*read]
}

// read is one history read waiting for its batch.
type read struct {
	q     claim.HistoryQuery
	state atomic.Int32 // bidWaiting, then bidAnswered or bidAbandoned
	done  chan struct{}
	recs  []claim.Record
	err   error
}

// history reads job's newest limit runs in the next batch, or gives up
// when ctx ends.
func (b *reader) history(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	x := &read{q: claim.HistoryQuery{Job: job, Limit: limit}, done: make(chan struct{})}
	if b.q.add(x) {
		b.d.exec.Go(func() { b.send(ctx) })
	}
	select {
	case <-x.done:
	case <-ctx.Done():
		if x.state.CompareAndSwap(bidWaiting, bidAbandoned) {
			return nil, context.Cause(ctx)
		}
		<-x.done // being answered
	}
	return x.recs, x.err
}

// send sends batches until no read is waiting. The calls are detached
// from ctx (the first reader's: its values only) and bounded by a third
// of the lease, the probe's own bound.
func (b *reader) send(ctx context.Context) {
	for {
		batch := b.q.take()
		if len(batch) == 0 {
			return
		}
		var (
			qs      []claim.HistoryQuery
			answers = map[claim.HistoryQuery]int{} // query → its index in qs
			sent    []*read
		)
		for _, x := range batch {
			if !x.state.CompareAndSwap(bidWaiting, bidAnswered) {
				continue // its caller left
			}
			sent = append(sent, x)
			if _, ok := answers[x.q]; !ok {
				answers[x.q] = len(qs)
				qs = append(qs, x.q)
			}
		}
		if len(qs) == 0 {
			continue
		}
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.d.r.opts.Lease/3)
		hists, err := claim.Histories(bctx, b.d.r.opts.Claimer, qs)
		cancel()
		for _, x := range sent {
			if x.err = err; err == nil {
				x.recs = hists[answers[x.q]]
			}
			close(x.done)
		}
	}
}
