package redis

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// A server that lost its data forgets the done markers of finished runs,
// or (restored from disk) remembers some of them as still running, and
// the restart guard (see doc.go) only holds runs for a lease:
// a replica that stood by for a run finished just before the restart would
// be granted it afterwards and run it again. The replica that finished it
// still knows, and so do the replicas whose claims found it done. So each
// Claimer remembers its own recent terminal releases and the runs it found
// done and, once it has one, watches the namespace's marker; when the
// marker changes (the server restarted), it writes those done markers back
// over any record the restart left of the run but a newer grant, within
// the guard's lease. What remains exposed is a run that finished just
// before the loss, on a replica that is gone too, before any other
// replica's claim found it done.

// maxRemembered bounds the releases a Claimer remembers.
const maxRemembered = 50_000

// doneLog is a Claimer's memory of its recent terminal releases and the
// watcher that writes them back after a data loss.
type doneLog struct {
	node *redisnode.Node
	ttl  time.Duration
	// lease is the last lease this Claimer claimed with, in ns: the guard
	// lasts one, and the watch looks four times within it.
	lease atomic.Int64

	mu    sync.Mutex
	runs  []redisnode.Finished // oldest first, from head on
	ids   []string             // runs' IDs, kept beside them: formatting one costs more than the map
	head  int
	known map[string]bool // the run IDs in runs[head:]
	// origin is, by bucket, the server run_id this Claimer's scripts had
	// last seen when it first remembered a run there, and when.
	origin map[int]origin

	start sync.Once
	stop  context.CancelFunc
	done  chan struct{}
	// check asks the watcher to look now (a claim was held by the guard).
	check chan struct{}
	// guard is told of each restart guard the watcher finds begun (the
	// Claimer's guardBegan).
	guard func(since time.Time, lease time.Duration)
	// unsafe is what the watcher's last look at the server's settings
	// found that cannot keep a claim (redisnode.Node.Check), or nil.
	unsafe atomic.Pointer[error]
}

// refusal is why claims are refused now (see unsafe), or nil.
func (d *doneLog) refusal() error {
	if p := d.unsafe.Load(); p != nil {
		return *p
	}
	return nil
}

// origin is where a doneLog's memory of a bucket began: the server its
// scripts last saw there, and when the first run was remembered.
type origin struct {
	server string
	at     time.Time
}

func newDoneLog(n *redisnode.Node, ttl time.Duration) *doneLog {
	return &doneLog{node: n, ttl: ttl, check: make(chan struct{}, 1)}
}

// released remembers the terminal releases among cls that succeeded.
func (d *doneLog) released(cls []*claim.Claim, outcomes []claim.Status, errs []error) {
	now := time.Now()
	var fs []redisnode.Finished
	for i, cl := range cls {
		if errs[i] != nil || !outcomes[i].Terminal() {
			continue
		}
		fs = append(fs, redisnode.Finished{Run: cl.Run, Token: cl.Token, Holder: cl.Holder, Fence: cl.Fence,
			Attempt: cl.Attempt, Status: outcomes[i], At: now})
	}
	d.add(fs)
}

// add remembers fs, each run once, and starts the watcher on the first:
// the terminal releases this Claimer made, and the runs its claims found
// done, finished by whichever replica. Every replica that stood by for a
// run knows it finished, so its done marker survives a data loss as long
// as one of them is up, not only while the replica that finished it is.
// The tokens of runs found done stay unknown; the write-back needs none.
// The first run remembered in a bucket also records the server its
// scripts last saw there, which the watcher's first reading of the
// bucket's marker is compared with (see watch).
func (d *doneLog) add(fs []redisnode.Finished) {
	if len(fs) == 0 {
		return
	}
	d.mu.Lock()
	if d.known == nil {
		d.known, d.origin = map[string]bool{}, map[int]origin{}
	}
	added := false
	for _, f := range fs {
		id := f.Run.ID()
		if d.known[id] {
			continue
		}
		d.known[id] = true
		d.runs, d.ids = append(d.runs, f), append(d.ids, id)
		added = true
		if d.node != nil {
			if b := d.node.Bucket(f.Run.Job); d.origin[b].server == "" {
				d.origin[b] = origin{server: d.node.Seen(b), at: f.At}
			}
		}
	}
	d.prune(fs[0].At)
	d.mu.Unlock()
	if added {
		d.start.Do(d.launch)
	}
}

// prune forgets what is past DoneTTL or beyond maxRemembered, moving the
// rest down once half the slice is forgotten (amortized O(1) per release).
// d.mu is held.
func (d *doneLog) prune(now time.Time) {
	for d.head < len(d.runs) && (len(d.runs)-d.head > maxRemembered || now.Sub(d.runs[d.head].At) >= d.ttl) {
		delete(d.known, d.ids[d.head])
		d.head++
	}
	if d.head > 0 && d.head >= len(d.runs)/2 {
		d.runs = append(d.runs[:0], d.runs[d.head:]...)
		d.ids = append(d.ids[:0], d.ids[d.head:]...)
		d.head = 0
	}
}

// recent returns the remembered releases still within DoneTTL.
func (d *doneLog) recent() []redisnode.Finished {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.prune(time.Now())
	return append([]redisnode.Finished(nil), d.runs[d.head:]...)
}

func (d *doneLog) launch() {
	ctx, cancel := context.WithCancel(context.Background())
	d.stop, d.done = cancel, make(chan struct{})
	go func() {
		defer close(d.done)
		d.watch(ctx)
	}()
}

// close stops the watcher, if it was started.
func (d *doneLog) close() {
	d.start.Do(func() {}) // no watcher may start from now on
	if d.stop != nil {
		d.stop()
		<-d.done
	}
}

// poke asks the watcher to look at once.
func (d *doneLog) poke() {
	select {
	case d.check <- struct{}{}:
	default:
	}
}

// lookAtLeast is the least time a look of the watcher may take.
const lookAtLeast = 3 * time.Second

// every is how often the watcher looks: four times a lease, between 50ms
// and 10s.
func (d *doneLog) every() time.Duration {
	return min(max(time.Duration(d.lease.Load())/4, 50*time.Millisecond), 10*time.Second)
}

// watch reads the marker every lease/4, or at once when a claim saw the
// server change, and writes the remembered done markers back when it
// changes. On a cluster each bucket has its own marker, on the master
// that holds its slot: the watch reads those of the buckets it remembers
// releases in, and writes back a bucket's when its marker changes (its
// master failed over or restarted). The first reading of a marker is the
// baseline, unless it already names another server than the one this
// Claimer's scripts had last seen in the bucket when it first remembered
// a run there (origin), or names a guard: then the server changed
// between the first release and the first reading, which a loaded
// machine or a cut link can delay past a restart, or may have. Reading
// the marker starts the restart guard if nothing has yet, so the
// write-back has most of a lease; it is bounded by one.
func (d *doneLog) watch(ctx context.Context) {
	epochs := map[int]string{} // by bucket
	// The buckets whose write-back did not all land: sent again at the
	// next look. A server that went back in time while it refused writes
	// (out of memory, read-only) answered the marker's read, began the
	// guard, and refused the write-back; sent once, it was never sent
	// again, the guard ran out before writes were taken, and a finished
	// run was granted again (the explorer's rewind class).
	pending := map[int]bool{}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.check:
		}
		every, lease := d.every(), time.Duration(d.lease.Load())
		buckets := d.buckets()
		origins := make([]origin, len(buckets))
		d.mu.Lock()
		for i, b := range buckets {
			origins[i] = d.origin[b]
		}
		d.mu.Unlock()
		// A look may take longer than the time to the next: bounded by
		// every alone (50ms before this claimer's first claim, lease/4
		// after), a look over a slow link (900ms round trips) never came
		// back, its connection was closed, and the next dialled anew (a
		// HELLO round trip first) and timed out again: twenty connections
		// a second, each timeout counted as a call unanswered (takeovers
		// held), and the releases and renewals of the same client, left
		// to dial too, took two round trips and missed a lease (TestFaults,
		// stop 69). lookAtLeast leaves a new connection three of them.
		cctx, cancel := context.WithTimeout(ctx, max(every, lookAtLeast))
		nows, errs := d.node.Epochs(cctx, buckets, lease)
		// The settings Open checked, again: a maxmemory-policy set to
		// evict while replicas run (CONFIG SET, a restart with another
		// config) let the server drop live claims, and runs started twice
		// (an outside review). Claims are refused while it stands; a
		// server out of reach is the claims' own to find.
		switch err := d.node.Check(cctx); {
		case err == nil:
			d.unsafe.Store(nil)
		case !errors.Is(err, claim.ErrUnavailable) && cctx.Err() == nil:
			d.unsafe.Store(&err)
		}
		cancel()
		changed := map[int]bool{}
		for i, b := range buckets {
			if errors.Is(errs[i], goredis.ErrClosed) {
				return // the client was closed without Close: nothing left to watch
			}
			if errs[i] != nil {
				continue
			}
			server, since, _ := strings.Cut(nows[i], " ")
			ms, _ := strconv.ParseInt(since, 10, 64)
			epoch, known := epochs[b]
			o := origins[i]
			switch {
			case known && nows[i] != epoch, !known && o.server != "" && o.server != server:
				changed[b] = true
				if ms > 0 && d.guard != nil {
					d.guard(time.UnixMilli(ms), lease)
				}
			case !known && ms > 0:
				// A first reading that names a guard, on the server the
				// scripts saw: the guard may have begun after the first
				// release remembered here, under the same run_id (the
				// server went back to a copy of its data, which keeps its
				// process), and only the guard's start tells. Taken for
				// the baseline, it was never written back: a watcher whose
				// first look was refused (writes refused, out of memory)
				// or late (a loaded machine) left a finished run to be
				// granted again once the guard ended (CI, 1 in 5 runs of
				// TestARewindWhileWritesAreRefusedStaysDone). Writing
				// back where nothing was lost writes no marker (though,
				// as any write-back, it holds a guard still on for up to
				// a lease more); a guard that began a lease or more
				// before the first release is not reported again.
				changed[b] = true
				if at := time.UnixMilli(ms); at.After(o.at.Add(-lease)) && d.guard != nil {
					d.guard(at, lease)
				}
			}
			epochs[b] = nows[i]
			if pending[b] {
				changed[b] = true
			}
		}
		if len(changed) > 0 {
			// Each script call extends the guard by a lease (Node.Restore),
			// and a keeper extends it meanwhile, every lease/4, until the
			// write-back is sent: the bound is for a server that stopped
			// answering.
			rctx, cancel := context.WithTimeout(ctx, max(4*lease, 10*time.Second))
			stopKeeping := d.keep(rctx, slices.Sorted(maps.Keys(changed)), lease)
			var back []redisnode.Finished
			for _, f := range d.recent() { // with releases acknowledged meanwhile
				if changed[d.node.Bucket(f.Run.Job)] {
					back = append(back, f)
				}
			}
			pending = d.node.Restore(rctx, back, d.ttl, lease)
			stopKeeping()
			cancel()
		}
		t.Reset(every)
	}
}

// keep holds the restart guard of buckets (Node.Hold) at once and then
// every lease/4 until the returned func is called (it waits for the
// keeper) or ctx ends.
func (d *doneLog) keep(ctx context.Context, buckets []int, lease time.Duration) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(lease/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			_ = d.node.Hold(ctx, buckets, lease) // one that fails leaves the next to try
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// buckets are the buckets whose markers the watch reads: the one bucket of
// a single server, and on a cluster those of the runs it remembers.
func (d *doneLog) buckets() []int {
	if d.node.Buckets() == 1 {
		return []int{0}
	}
	in := make([]bool, d.node.Buckets())
	d.mu.Lock()
	d.prune(time.Now())
	for _, f := range d.runs[d.head:] {
		in[d.node.Bucket(f.Run.Job)] = true
	}
	d.mu.Unlock()
	var out []int
	for b, ok := range in {
		if ok {
			out = append(out, b)
		}
	}
	return out
}
