package redis

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// A server that lost its data forgets the done markers of finished runs,
// or (restored from disk) remembers some of them as still running, and
// the restart guard (see the package comment) only holds runs for a lease:
// a replica that stood by for a run finished just before the restart would
// be granted it afterwards and run it again. The replica that finished it
// still knows. So each Claimer remembers its own recent terminal releases
// and, once it has made one, watches the namespace's marker; when the
// marker changes (the server restarted), it writes those done markers back
// over any record the restart left of the run but a newer grant, within
// the guard's lease. What remains exposed is a run whose finishing replica
// is gone too.

const (
	// maxRemembered bounds the releases a Claimer remembers.
	maxRemembered = 50_000
	// restoreChunk is how many done markers one script call writes back:
	// 50,000 markers cost a hundred round trips, and each call blocks the
	// server for a few milliseconds at most.
	restoreChunk = 500
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

// watch reads the marker every lease/4, or at once when a claim saw the
// server change, and writes the remembered done markers back when it
// changes. The first reading is the baseline. Reading the marker starts
// the restart guard if nothing has yet, so the write-back has most of a
// lease; it is bounded by one.
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
		every, lease := d.every(), time.Duration(d.lease.Load())
		cctx, cancel := context.WithTimeout(ctx, every)
		now, err := d.node.epochOf(cctx, lease)
		cancel()
		if err == nil && epoch != "" && now != epoch {
			// Each script call extends the guard by a lease (restoreScript):
			// the bound is for a server that stopped answering.
			rctx, cancel := context.WithTimeout(ctx, max(4*lease, 10*time.Second))
			d.node.restore(rctx, d.recent(), d.ttl, lease)
			cancel()
		}
		if errors.Is(err, goredis.ErrClosed) {
			return // the client was closed without Close: nothing left to watch
		}
		if err == nil {
			epoch = now
		}
		t.Reset(every)
	}
}

// epochScript checks the namespace's marker against the server, as a
// claim does (starting the restart guard if the server lost its data),
// and returns it.
//
// KEYS: marker. ARGV: the run_id last seen, lease ms.
// Reply: "<run_id> <guard start ms>".
var epochScript = goredis.NewScript(incarnationLua + `
local id, since = incarnation(KEYS[1], ARGV[1], tonumber(ARGV[2]), math.floor(clock() / 1000))
return id .. ' ' .. s(since)
`)

// restoreScript writes finished runs' done markers back. It overwrites no
// record of a run but one the restart left behind: none, or a live one
// that is this replica's own grant or from an earlier incarnation of the
// server (a snapshot taken before the release). A run granted again since
// the restart keeps its new record. While the restart guard holds, each
// call extends it to a lease from now, so that a write-back that has
// begun lands before anyone can claim: a large one on a loaded server
// delays the guard's end rather than racing it.
//
// KEYS: jobs set, marker, then per run: run hash, job history zset.
// ARGV: lease ms, then per run: token, holder, fence, attempt, status,
// finished ms (the releasing replica's clock), TTL ms, scheduled ms, run
// id, job.
// Reply: how many markers were written.
var restoreScript = goredis.NewScript(incarnationLua + `
local id = server()
local now = math.floor(clock() / 1000)
local lease = tonumber(ARGV[1])
local m = redis.call('HMGET', KEYS[2], 'run_id', 'since', 'hold')
local since, hold = tonumber(m[2]) or 0, tonumber(m[3]) or 0
if m[1] == id and since > 0 and now < math.max(since + lease, hold) then
  redis.call('HSET', KEYS[2], 'hold', s(math.max(hold, now + lease)))
end
local written = 0
for i = 0, (#KEYS - 2) / 2 - 1 do
  local run, a = KEYS[3 + 2 * i], 1 + 10 * i
  local h = redis.call('HMGET', run, 'token', 'status', 'server')
  local stale = (h[2] == 'running' or h[2] == 'interrupted') and (h[1] == ARGV[a + 1] or h[3] ~= id)
  if not h[2] or stale then
    redis.call('DEL', run)
    redis.call('HSET', run, 'token', ARGV[a + 1], 'holder', ARGV[a + 2], 'fence', ARGV[a + 3],
      'attempt', ARGV[a + 4], 'status', ARGV[a + 5], 'started_at', ARGV[a + 6], 'lease_until', ARGV[a + 6],
      'finished_at', ARGV[a + 6])
    redis.call('PEXPIRE', run, ARGV[a + 7])
    redis.call('ZADD', KEYS[4 + 2 * i], ARGV[a + 8], ARGV[a + 9])
    redis.call('SADD', KEYS[1], ARGV[a + 10])
    written = written + 1
  end
end
return written
`)

// markNewScript writes the marker of a namespace declared new.
//
// KEYS: marker. Reply: 1 if written, 0 if the namespace had one.
var markNewScript = goredis.NewScript(incarnationLua + `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'run_id', server(), 'since', '0')
return 1
`)

// MarkNew declares that the namespace under prefix ("" for DefaultPrefix)
// is new on the server behind client: nothing was ever claimed in it, so
// its first claims need not wait out the restart guard that a missing
// marker otherwise starts on a server up for less than a lease (see the
// package comment). It does nothing to a namespace that has a marker.
// Call it only where a namespace is created, as tests do: on a namespace
// whose server restarted empty it would let a run still held by a replica
// be granted again.
func MarkNew(ctx context.Context, client goredis.UniversalClient, prefix string) error {
	k := keys{Options{Prefix: prefix}.withDefaults().Prefix}
	return translate(ctx, markNewScript.Run(ctx, client, []string{k.marker()}).Err())
}

// epochOf reads the marker, checked against the server as a claim under
// lease would check it.
func (n *Node) epochOf(ctx context.Context, lease time.Duration) (string, error) {
	v, err := epochScript.Run(ctx, n.client, []string{n.keys.marker()}, n.seenID(), lease.Milliseconds()).Text()
	if errors.Is(err, goredis.ErrClosed) {
		return "", err
	}
	if err == nil {
		id, _, _ := strings.Cut(v, " ")
		n.ran(id)
	}
	return v, translate(ctx, err)
}

// restore writes back the done markers of runs, best effort, restoreChunk
// to a script call, one call after another so that each extends the guard
// as it lands; each marker lives what is left of ttl since its release.
func (n *Node) restore(ctx context.Context, runs []finished, ttl, lease time.Duration) {
	now := time.Now()
	for len(runs) > 0 && ctx.Err() == nil {
		chunk := runs[:min(restoreChunk, len(runs))]
		runs = runs[len(chunk):]
		keys := []string{n.keys.jobs(), n.keys.marker()}
		args := []any{lease.Milliseconds()}
		for _, f := range chunk {
			left := ttl - now.Sub(f.at)
			if left <= 0 {
				continue
			}
			id := f.run.ID()
			keys = append(keys, n.keys.run(id), n.keys.runs(f.run.Job))
			args = append(args, f.token, f.holder, f.fence, f.attempt, string(f.status), f.at.UnixMilli(),
				left.Milliseconds()+1, f.run.At.UnixMilli(), id, f.run.Job)
		}
		if len(args) > 1 {
			_ = restoreScript.Run(ctx, n.client, keys, args...).Err() // what did not land is exposed as if unremembered
		}
	}
}
