package redis

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// A server restarted empty forgets the done markers of finished runs, and
// the restart guard (see the package comment) only holds runs for a lease:
// a replica that stood by for a run finished just before the restart would
// be granted it afterwards and run it again. The replica that finished it
// still knows. So each Claimer remembers its own recent terminal releases
// and, once it has made one, watches the namespace's epoch marker; when
// the marker changes (the server lost its data), it writes those done
// markers back where the server has no record of the run, well within the
// guard's lease. What remains exposed is a run whose finishing replica is
// gone too.

const (
	// maxRemembered bounds the releases a Claimer remembers.
	maxRemembered = 50_000
	// restoreChunk is how many done markers one pipeline writes back.
	restoreChunk = 1000
)

// finished is a run this Claimer released with a terminal outcome.
type finished struct {
	run     claim.Run
	token   string
	holder  string
	fence   int64
	attempt int
	status  claim.Status
	at      time.Time // when the release was acknowledged (local clock)
}

// doneLog is a Claimer's memory of its recent terminal releases and the
// watcher that writes them back after a data loss.
type doneLog struct {
	node *Node
	ttl  time.Duration
	// lease is the last lease this Claimer claimed with, in ns: the guard
	// lasts one, and the watch looks four times within it.
	lease atomic.Int64

	mu   sync.Mutex
	runs []finished // oldest first, from head on
	head int

	start sync.Once
	stop  context.CancelFunc
	done  chan struct{}
	// check asks the watcher to look now (a claim was held by the guard).
	check chan struct{}
}

func newDoneLog(n *Node, ttl time.Duration) *doneLog {
	return &doneLog{node: n, ttl: ttl, check: make(chan struct{}, 1)}
}

// released remembers the terminal releases among cls that succeeded, and
// starts the watcher on the first.
func (d *doneLog) released(cls []*claim.Claim, outcomes []claim.Outcome, errs []error) {
	now := time.Now()
	d.mu.Lock()
	added := false
	for i, cl := range cls {
		if errs[i] != nil || !outcomes[i].Terminal() {
			continue
		}
		d.runs = append(d.runs, finished{run: cl.Run, token: cl.Token, holder: cl.Holder, fence: cl.Fence,
			attempt: cl.Attempt, status: claim.Status(outcomes[i]), at: now})
		added = true
	}
	d.prune(now)
	d.mu.Unlock()
	if added {
		d.start.Do(d.launch)
	}
}

// prune forgets what is past DoneTTL or beyond maxRemembered, moving the
// rest down once half the slice is forgotten (amortized O(1) per release).
// d.mu is held.
func (d *doneLog) prune(now time.Time) {
	d.head = max(d.head, len(d.runs)-maxRemembered)
	for d.head < len(d.runs) && now.Sub(d.runs[d.head].at) >= d.ttl {
		d.head++
	}
	if d.head > 0 && d.head >= len(d.runs)/2 {
		d.runs = append(d.runs[:0], d.runs[d.head:]...)
		d.head = 0
	}
}

// recent returns the remembered releases still within DoneTTL.
func (d *doneLog) recent() []finished {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.prune(time.Now())
	return append([]finished(nil), d.runs[d.head:]...)
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

// every is how often the watcher looks: four times a lease, between 50ms
// and 10s.
func (d *doneLog) every() time.Duration {
	return min(max(time.Duration(d.lease.Load())/4, 50*time.Millisecond), 10*time.Second)
}

// watch reads the epoch marker every lease/4 and writes the remembered
// done markers back when it changes. The first reading is the baseline.
func (d *doneLog) watch(ctx context.Context) {
	var epoch string
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.check:
		}
		every := d.every()
		cctx, cancel := context.WithTimeout(ctx, every)
		now, err := d.node.epochOf(cctx)
		if err == nil && epoch != "" && now != epoch {
			d.node.restore(cctx, d.recent(), d.ttl)
		}
		cancel()
		if errors.Is(err, goredis.ErrClosed) {
			return // the client was closed without Close: nothing left to watch
		}
		if err == nil {
			epoch = now
		}
		t.Reset(every)
	}
}

// epochScript reads the namespace's epoch marker. A Claimer asks only once
// its claims have run on the server, so a missing marker means the server
// lost its data: the script writes it with the server's time, which starts
// the restart guard exactly as a claim that found it missing would.
//
// KEYS: epoch marker. Reply: the marker.
var epochScript = goredis.NewScript(`
local born = redis.call('GET', KEYS[1])
if not born then
  local t = redis.call('TIME')
  born = string.format('%.0f', math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000))
  redis.call('SET', KEYS[1], born)
end
return born
`)

// restoreScript writes a finished run's done marker back if the server has
// no record of the run. It never overwrites: a run granted again in the
// meantime keeps its new record.
//
// KEYS: run hash, job history zset, jobs set. ARGV: token, holder, fence,
// attempt, status, finished ms (the releasing replica's clock), TTL ms,
// scheduled ms, run id, job.
var restoreScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'holder', ARGV[2], 'fence', ARGV[3], 'attempt', ARGV[4],
  'status', ARGV[5], 'started_at', ARGV[6], 'lease_until', ARGV[6], 'finished_at', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('ZADD', KEYS[2], ARGV[8], ARGV[9])
redis.call('SADD', KEYS[3], ARGV[10])
return 1
`)

// epochOf reads (and, if it is missing, writes) the epoch marker.
func (n *Node) epochOf(ctx context.Context) (string, error) {
	v, err := epochScript.Run(ctx, n.client, []string{n.keys.epoch()}).Text()
	if errors.Is(err, goredis.ErrClosed) {
		return "", err
	}
	return v, translate(ctx, err)
}

// restore writes back the done markers of runs, best effort, in pipelines
// of restoreChunk; each marker lives what is left of ttl since its release.
func (n *Node) restore(ctx context.Context, runs []finished, ttl time.Duration) {
	now := time.Now()
	var live []finished
	for _, f := range runs {
		if ttl-now.Sub(f.at) > 0 {
			live = append(live, f)
		}
	}
	for len(live) > 0 && ctx.Err() == nil {
		chunk := live[:min(restoreChunk, len(live))]
		live = live[len(chunk):]
		_ = n.pipeline(ctx, restoreScript, len(chunk), func(i int) ([]string, []any) {
			f := chunk[i]
			id := f.run.ID()
			left := ttl - now.Sub(f.at)
			return []string{n.keys.run(id), n.keys.runs(f.run.Job), n.keys.jobs()},
				[]any{f.token, f.holder, f.fence, f.attempt, string(f.status), f.at.UnixMilli(),
					left.Milliseconds() + 1, f.run.At.UnixMilli(), id, f.run.Job}
		}, func(int, *goredis.Cmd) error { return nil })
	}
}
