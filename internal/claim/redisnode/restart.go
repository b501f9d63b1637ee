package redisnode

import (
	"context"
	"errors"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// restoreChunk is how many done markers one script call writes back:
// 50,000 markers cost a hundred round trips, and each call blocks the
// server for a few milliseconds at most.
const restoreChunk = 500

// Finished is a run released with a terminal outcome, as Restore writes
// its done marker back.
type Finished struct {
	Run     claim.Run
	Token   string
	Holder  string
	Fence   int64
	Attempt int
	Status  claim.Status
	At      time.Time // when the release was acknowledged (local clock)
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
// that is this replica's own grant, from an earlier incarnation of the
// server (a snapshot taken before the release), or granted before the
// guard began (an earlier attempt's, back from an older copy). A run granted again since
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
  local h = redis.call('HMGET', run, 'token', 'status', 'server', 'started_at')
  -- A live record is stale if it is this replica's own grant, from an
  -- earlier incarnation, or granted before the guard began: the loss
  -- came between, and a run known done was granted no more after it
  -- (an earlier attempt's record, back from a copy of the server's data
  -- under the same run_id, kept the done marker out: the explorer's
  -- rewind class).
  local stale = (h[2] == 'running' or h[2] == 'interrupted') and
    (h[1] == ARGV[a + 1] or h[3] ~= id or (since > 0 and (tonumber(h[4]) or 0) < since))
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
redis.call('HSET', KEYS[1], 'run_id', server(), 'since', '0', 'replid', lineage())
return 1
`)

// MarkNew declares that the namespace under prefix ("" for DefaultPrefix)
// is new on the server behind client (every bucket of it, on a cluster):
// nothing was ever claimed in it, so its first claims need not wait out
// the restart guard that a missing marker otherwise starts on a server up
// for less than a lease, or once a replica (see package redis). It does
// nothing to a bucket that has a marker. Call it only where a namespace is
// created, as tests do: on a namespace whose server restarted empty it
// would let a run still held by a replica be granted again.
func MarkNew(ctx context.Context, client goredis.UniversalClient, prefix string) error {
	n := New(client, Options{Prefix: prefix}, 0, 1)
	return errors.Join(n.pipeline(ctx, markNewProgram, n.keys.count(), func(b int) ([]string, []any) {
		return []string{n.keys.marker(b)}, nil
	}, func(int, *goredis.Cmd) error { return nil })...)
}

// Epochs reads the markers of buckets, checked against the server as a
// claim under lease would check them, in one pipeline (a single bucket
// goes without one): "<run_id> <guard start ms>" each. A client closed
// under it returns errors wrapping goredis.ErrClosed.
func (n *Node) Epochs(ctx context.Context, buckets []int, lease time.Duration) ([]string, []error) {
	out := make([]string, len(buckets))
	errs := n.pipeline(ctx, epochProgram, len(buckets), func(i int) ([]string, []any) {
		b := buckets[i]
		return []string{n.keys.marker(b)}, []any{n.Seen(b), lease.Milliseconds()}
	}, func(i int, cmd *goredis.Cmd) error {
		v, err := cmd.Text()
		if err != nil {
			return n.translate(ctx, err)
		}
		id, _, _ := strings.Cut(v, " ")
		n.ran(buckets[i], id)
		out[i] = v
		return nil
	})
	return out, errs
}

// Hold extends the restart guard of each of buckets, where one holds, to
// a lease from now (as every Restore call does), in one pipeline: the
// watcher keeps the guard up with it while it prepares and sends a
// write-back, so that a slow client (thirty thousand markers to gather on
// a loaded machine took over a second) cannot let the guard lapse before
// its first call lands.
func (n *Node) Hold(ctx context.Context, buckets []int, lease time.Duration) error {
	return errors.Join(n.pipeline(ctx, restoreProgram, len(buckets), func(i int) ([]string, []any) {
		b := buckets[i]
		return []string{n.keys.jobs(b), n.keys.marker(b)}, []any{lease.Milliseconds()}
	}, func(int, *goredis.Cmd) error { return nil })...)
}

// Restore writes back the done markers of runs, restoreChunk to a script
// call (each within one bucket), one call after another so that each
// extends its bucket's guard as it lands; each marker lives what is left
// of ttl since its release. It returns the buckets whose write-back did
// not all land (refused, unanswered), for the caller to send again.
func (n *Node) Restore(ctx context.Context, runs []Finished, ttl, lease time.Duration) (failed map[int]bool) {
	now := time.Now()
	byBucket := map[int][]Finished{}
	var order []int
	for _, f := range runs {
		b := n.keys.bucket(f.Run.Job)
		if _, ok := byBucket[b]; !ok {
			order = append(order, b)
		}
		byBucket[b] = append(byBucket[b], f)
	}
	for _, b := range order {
		runs := byBucket[b]
		for len(runs) > 0 && ctx.Err() == nil {
			chunk := runs[:min(restoreChunk, len(runs))]
			runs = runs[len(chunk):]
			keys := []string{n.keys.jobs(b), n.keys.marker(b)}
			args := []any{lease.Milliseconds()}
			for _, f := range chunk {
				left := ttl - now.Sub(f.At)
				if left <= 0 {
					continue
				}
				id := f.Run.ID()
				keys = append(keys, n.keys.run(id), n.keys.runs(f.Run.Job))
				args = append(args, f.Token, f.Holder, f.Fence, f.Attempt, string(f.Status), f.At.UnixMilli(),
					left.Milliseconds()+1, f.Run.At.UnixMilli(), id, f.Run.Job)
			}
			if len(args) > 1 {
				if err := restoreScript.Run(ctx, n.client, keys, args...).Err(); err != nil {
					if failed == nil {
						failed = map[int]bool{}
					}
					failed[b] = true
				}
			}
		}
		if ctx.Err() != nil && len(runs) > 0 {
			if failed == nil {
				failed = map[int]bool{}
			}
			failed[b] = true
		}
	}
	return failed
}

// RecordGone writes the record of a run that finished but whose release
// found no record of it (ErrGone: the server lost its keys while it ran),
// as Restore would write it back: over no record, or one the loss left,
// never over a newer grant. It reports whether it was written.
func (n *Node) RecordGone(ctx context.Context, f Finished, ttl, lease time.Duration) (bool, error) {
	id := f.Run.ID()
	b := n.keys.bucket(f.Run.Job)
	written, err := restoreScript.Run(ctx, n.client,
		[]string{n.keys.jobs(b), n.keys.marker(b), n.keys.run(id), n.keys.runs(f.Run.Job)},
		lease.Milliseconds(), f.Token, f.Holder, f.Fence, f.Attempt, string(f.Status), f.At.UnixMilli(),
		ttl.Milliseconds(), f.Run.At.UnixMilli(), id, f.Run.Job).Int()
	if err != nil {
		return false, n.translate(ctx, err)
	}
	return written == 1, nil
}

// DropPrefix deletes every key under prefix (a namespace a harness made),
// in batches, on every master of a cluster; glob characters in prefix are
// matched literally.
func DropPrefix(ctx context.Context, client goredis.UniversalClient, prefix string) error {
	if cc, ok := client.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return dropPrefix(ctx, c, prefix, true)
		})
	}
	return dropPrefix(ctx, client, prefix, false)
}

// dropPrefix is DropPrefix on one server; on a cluster node, keys of
// different slots go in separate commands (a multi-key command must stay
// in one slot), pipelined.
func dropPrefix(ctx context.Context, client goredis.UniversalClient, prefix string, cluster bool) error {
	match := strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`).Replace(prefix) + "*"
	iter := client.Scan(ctx, 0, match, 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		var err error
		if cluster {
			_, err = client.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for _, k := range batch {
					p.Unlink(ctx, k)
				}
				return nil
			})
		} else {
			err = client.Unlink(ctx, batch...).Err()
		}
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return iter.Err()
}
