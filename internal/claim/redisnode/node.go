package redisnode

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Defaults for Options.
const (
	DefaultPrefix       = "scheduler:"
	DefaultDoneTTL      = 48 * time.Hour
	DefaultHistoryLimit = 1000
)

// Options configure a Node. Prefix, DoneTTL, HistoryLimit and
// AllowEviction are those of redis.Options, which documents them; zero
// values take the defaults above.
type Options struct {
	Prefix        string
	DoneTTL       time.Duration
	HistoryLimit  int
	AllowEviction bool
	// HashTags lays the keys out for Redis Cluster (see keys) on a client
	// that is not a *goredis.ClusterClient but routes to one; a
	// *goredis.ClusterClient always gets that layout.
	HashTags bool
	// Restarted, if set, is called when a script reports another run_id
	// than the last one for a bucket: the server (or the bucket's master)
	// restarted or changed (redis.Claimer's write-back).
	Restarted func()
	// GrantPages makes every grant of a call that asks for pages
	// (claim.WithPages) carry its job's page of records (claim.Claim.Page,
	// Reply.Page), read in the claim script with it.
	// Only where this node alone decides a grant: a Redlock node's page
	// is one node's view, not the quorum's.
	GrantPages bool
}

func (o Options) withDefaults() Options {
	o.Prefix = cmp.Or(o.Prefix, DefaultPrefix)
	o.DoneTTL = cmp.Or(o.DoneTTL, DefaultDoneTTL)
	o.HistoryLimit = cmp.Or(o.HistoryLimit, DefaultHistoryLimit)
	return o
}

// Node runs the claim scripts against one Redis server and reports what
// that server said. redis.Claimer decides on the answer of one Node;
// redlock.Claimer decides on the answers of several.
type Node struct {
	client        goredis.UniversalClient
	keys          keys
	doneTTL       time.Duration
	historyLimit  int
	pageSize      int // claim.PageSize with Options.GrantPages, else 0
	allowEviction bool
	slot, slots   int64
	addr          string // the server's address, or a cluster's seeds, where the client tells
	// cluster is client when it is a *goredis.ClusterClient: its slot map
	// is reloaded when a node stops answering, and Check and Ping visit
	// every master.
	cluster *goredis.ClusterClient
	// seen holds, per bucket, the run_id of the server incarnation a claim
	// script last ran on: the script tells a marker that vanished under it
	// (keys deleted) from a new namespace by it.
	seen []atomic.Pointer[string]
	// restarted is Options.Restarted.
	restarted func()
	// evalOnly is set once the server refused functions: the programs go
	// as EVAL scripts from then on (see library.go).
	evalOnly atomic.Bool
	// unanswered holds takeovers back after a call went unanswered
	// (claim.Unanswered, claimBody); clocks, by a call that waited in
	// the server (serverClocks).
	unanswered claim.Unanswered
	clocks     serverClocks
}

// New returns a Node over client. Fences this node grants are congruent
// to slot modulo slots: redlock gives each node its own residue so that two
// nodes never hand out the same fence. A single server uses slot 0 of 1.
// It panics on a nil client or a slot outside [0, slots).
func New(client goredis.UniversalClient, opts Options, slot, slots int) *Node {
	if client == nil {
		panic("redis: nil client")
	}
	if slots < 1 || slot < 0 || slot >= slots {
		panic(fmt.Sprintf("redis: fence slot %d of %d", slot, slots))
	}
	opts = opts.withDefaults()
	n := &Node{
		client: client, keys: keys{opts.Prefix, tagged(client, opts.HashTags)}, doneTTL: opts.DoneTTL,
		historyLimit: opts.HistoryLimit, allowEviction: opts.AllowEviction,
		slot: int64(slot), slots: int64(slots), restarted: opts.Restarted,
	}
	if opts.GrantPages {
		n.pageSize = claim.PageSize
	}
	n.seen = make([]atomic.Pointer[string], n.keys.count())
	n.unanswered.Start()
	switch cl := client.(type) {
	case *goredis.Client:
		n.addr = cl.Options().Addr
	case *goredis.ClusterClient:
		n.cluster, n.addr = cl, strings.Join(cl.Options().Addrs, ",")
	}
	return n
}

// Cluster reports whether the node lays its keys out for Redis Cluster
// (hash-tagged buckets, see keys).
func (n *Node) Cluster() bool { return n.keys.tagged }

// Buckets is how many buckets the key layout has: 1 on a single server,
// Buckets on a cluster.
func (n *Node) Buckets() int { return n.keys.count() }

// Bucket is job's bucket: the marker, and the seen run_id, that its runs
// answer to.
func (n *Node) Bucket(job string) int { return n.keys.bucket(job) }

// DoneTTL is how long a run's hash outlives its lease or release.
func (n *Node) DoneTTL() time.Duration { return n.doneTTL }

// Addr is the server's address (a cluster's seed addresses, joined by
// commas), or "" if the client does not tell.
func (n *Node) Addr() string { return n.addr }

// Vote is a node's answer to a claim.
type Vote int

// Votes.
const (
	Granted Vote = iota + 1 // the node granted the run to the caller's token
	Held                    // another token holds a live lease
	Done                    // the run finished
)

// Reply is one node's answer to a claim. Times are on the node's clock.
type Reply struct {
	Vote       Vote
	Fence      int64        // Granted; Done: the fence of the grant that finished
	Attempt    int          // Granted: the attempt granted; Held, Done: the attempt recorded
	LeaseUntil time.Time    // Granted, Held
	Holder     string       // Held: the holder's instance; Done: the instance that finished
	HolderKey  string       // Held: TokenKey of the holder's token
	Status     claim.Status // Done
	// Restarted is set on a Held reply given because the server lost its
	// data: the restart guard began at LostAt and holds every run until
	// LeaseUntil.
	Restarted bool
	LostAt    time.Time
	// Page is a Granted reply's page of the job's records (see
	// Options.GrantPages); nil if none was asked for or one of its runs
	// had expired.
	Page []claim.Record
}

// TokenKey is the digest a Held reply carries for the holder's token (the
// first 16 hex digits of its SHA-1), so that votes can be grouped by grant
// without handing out tokens.
func TokenKey(token string) string {
	sum := sha1.Sum([]byte(token))
	return hex.EncodeToString(sum[:8])
}

// Seen is the run_id this node's scripts last reported for bucket b (""
// if none ran yet): the server incarnation its latest claims and releases
// of the bucket's jobs went to.
func (n *Node) Seen(b int) string {
	if p := n.seen[b].Load(); p != nil {
		return *p
	}
	return ""
}

// ran records the run_id a script reported for bucket b: the bucket's
// marker now names it, unless the server loses its data.
func (n *Node) ran(b int, id string) {
	if old := n.seen[b].Swap(&id); old != nil && *old != id && n.restarted != nil {
		n.restarted()
	}
}

// claimReply reads one run's reply to the claim script.
func claimReply(v any) (Reply, error) {
	vals, _ := v.([]any)
	r := reply(vals)
	var out Reply
	switch r.str(0) {
	case "granted":
		out = Reply{Vote: Granted, Fence: r.int(1), Attempt: int(r.int(2)), LeaseUntil: ms(r.int(3))}
		if len(vals) > 4 && vals[4] != nil {
			page, err := pageReply(vals[4])
			if err != nil {
				return Reply{}, err
			}
			out.Page = page
		}
	case "held":
		out = Reply{Vote: Held, Holder: r.str(1), LeaseUntil: ms(r.int(2)), HolderKey: r.str(3), Attempt: int(r.int(4))}
	case "done":
		out = Reply{Vote: Done, Status: claim.Status(r.str(1)), Attempt: int(r.int(2)), Holder: r.str(3), Fence: r.int(4)}
	case "error":
		return Reply{}, fmt.Errorf("redis: claim script: %s", r.str(1))
	default:
		return Reply{}, fmt.Errorf("redis: claim script replied %v", v)
	}
	if r.err != nil {
		return Reply{}, r.err
	}
	return out, nil
}

// scriptRuns is how many runs one call of a batch script (claim, release,
// commit) handles: a call of a hundred claims keeps the server busy for
// about a millisecond, so other clients' commands wait no longer than
// that behind it.
const scriptRuns = 100

// chunks splits the indices 0..count-1 into the calls of a batch script:
// runs of one bucket each (on a cluster a script touches one slot), at
// most scriptRuns to a call, in the order the runs came.
func (n *Node) chunks(count int, job func(i int) string) [][]int {
	var out [][]int
	open := map[int]int{} // bucket → its chunk being filled
	for i := range count {
		b := n.keys.bucket(job(i))
		c, ok := open[b]
		if !ok || len(out[c]) == scriptRuns {
			c = len(out)
			open[b] = c
			out = append(out, make([]int, 0, min(count, scriptRuns)))
		}
		out[c] = append(out[c], i)
	}
	return out
}

// batch runs p once per chunk of count runs (see chunks), all calls
// in one pipeline (a single call goes without one). head gives a call's
// leading keys and arguments for its bucket, item appends a run's, and
// read takes a call's reply (every batch script replies an array) and
// sets the per-run results. A call's error is each of its runs' error.
func (n *Node) batch(ctx context.Context, p *program, count int, job func(i int) string,
	head func(b int) ([]string, []any), item func(i int, keys []string, args []any) ([]string, []any),
	read func(b int, chunk []int, vals []any) error) []error {
	chunks := n.chunks(count, job)
	errs := make([]error, count)
	cerrs := n.pipeline(ctx, p, len(chunks), func(c int) ([]string, []any) {
		keys, args := head(n.keys.bucket(job(chunks[c][0])))
		for _, i := range chunks[c] {
			keys, args = item(i, keys, args)
		}
		return keys, args
	}, func(c int, cmd *goredis.Cmd) error {
		vals, err := cmd.Slice()
		if err != nil {
			return n.translate(ctx, err)
		}
		return read(n.keys.bucket(job(chunks[c][0])), chunks[c], vals)
	})
	for c, err := range cerrs {
		if err != nil {
			for _, i := range chunks[c] {
				errs[i] = err
			}
		}
	}
	return errs
}

// ClaimBatch asks the node to grant each of runs to its token for lease,
// in batches of one script call each (see claimProgram), pipelined. Each
// run is decided atomically, as it would be alone.
func (n *Node) ClaimBatch(ctx context.Context, runs []claim.Run, tokens []string, holder string, lease time.Duration) ([]Reply, []error) {
	replies := make([]Reply, len(runs))
	answers := make([]error, len(runs)) // a run's own error, in a call that answered
	ids := make([]string, len(runs))
	for i, run := range runs {
		ids[i] = run.ID()
	}
	hold, sent := n.unanswered.Hold(lease), localMS()
	page := 0
	if claim.PagesWanted(ctx) {
		page = n.pageSize
	}
	errs := n.batch(ctx, claimProgram, len(runs), func(i int) string { return runs[i].Job },
		func(b int) ([]string, []any) {
			seen, by := n.Seen(b), "0"
			if t, ok := n.clocks.latest(seen, sent, lease/4); ok && !hold {
				by = strconv.FormatInt(t, 10)
			} else if !hold {
				by = ""
			}
			return []string{n.keys.jobs(b), n.keys.marker(b)}, []any{holder, lease.Milliseconds(),
				n.doneTTL.Milliseconds(), n.historyLimit, n.slot, n.slots, seen, by, page}
		}, func(i int, keys []string, args []any) ([]string, []any) {
			job := runs[i].Job
			return append(keys, n.keys.run(ids[i]), n.keys.fence(job), n.keys.runs(job)),
				append(args, tokens[i], runs[i].At.UnixMilli(), ids[i], job)
		}, func(b int, chunk []int, vals []any) error {
			r := reply(vals)
			if id, now := r.str(0), r.int(1); r.err == nil {
				if by, ok := n.clocks.latest(id, sent, lease/4); ok && now > by {
					// The call waited in the server: a stall, as an
					// unanswered call shows (the script held its takeovers).
					n.unanswered.Note()
				}
				n.unanswered.Answered()
				n.ran(b, id)
				n.clocks.observe(id, sent, now)
			}
			if len(vals) == 5 && vals[2] == "restarted" {
				held := Reply{Vote: Held, Restarted: true, LostAt: ms(r.int(3)), LeaseUntil: ms(r.int(4))}
				if r.err != nil {
					return r.err
				}
				for _, i := range chunk {
					replies[i] = held
				}
				return nil
			}
			if r.err != nil || len(vals) != 2+len(chunk) {
				return fmt.Errorf("redis: claim script replied %v to %d runs", vals, len(chunk))
			}
			for k, i := range chunk {
				replies[i], answers[i] = claimReply(vals[2+k])
			}
			return nil
		})
	for i, err := range errs {
		if err == nil {
			errs[i] = answers[i]
		}
	}
	return replies, errs
}

// pipeline runs p count times in one pipeline, with the keys and
// arguments args gives for each, and hands each reply to read; it returns
// each run's error. What the server lacks (the library, or the script) is
// loaded, and the calls that found it missing go again in a second
// pipeline; a server without functions gets the calls as scripts from
// then on (see library.go). A single run is sent without a pipeline, as a
// bare call. On a cluster every call's keys share one bucket's hash tag,
// so each touches one slot; the cluster client splits the pipeline by
// node.
func (n *Node) pipeline(ctx context.Context, p *program, count int,
	args func(i int) ([]string, []any), read func(i int, cmd *goredis.Cmd) error) []error {
	errs := make([]error, count)
	todo := make([]int, count)
	for i := range todo {
		todo[i] = i
	}
	// Three tries at most: a function found missing, then loaded; or a
	// server without functions, then the script it lacks.
	for try := 0; len(todo) > 0; try++ {
		fn := n.functions(p)
		cmds := make([]*goredis.Cmd, len(todo))
		if len(todo) == 1 {
			keys, argv := args(todo[0])
			cmds[0] = n.call(ctx, n.client, p, fn, keys, argv...)
		} else {
			pipe := n.client.Pipeline()
			for k, i := range todo {
				keys, argv := args(i)
				cmds[k] = n.call(ctx, pipe, p, fn, keys, argv...)
			}
			_, _ = pipe.Exec(ctx) // errors are per command
		}
		var again []int
		missing := false
		for k, i := range todo {
			err := cmds[k].Err()
			switch {
			case err != nil && try < 2 && fn && noFunctions(err):
				n.evalOnly.Store(true)
				again = append(again, i)
			case err != nil && try < 2 && (goredis.HasErrorPrefix(err, "NOSCRIPT") || fn && functionMissing(err)):
				missing = true
				again = append(again, i)
			case err != nil:
				errs[i] = n.translate(ctx, err)
			default:
				errs[i] = read(i, cmds[k])
			}
		}
		if missing {
			if err := n.load(ctx, p, fn); err != nil {
				for _, i := range again {
					errs[i] = n.translate(ctx, err)
				}
				again = nil
			}
		}
		todo = again
	}
	return errs
}

// AbortBatch is Abort for many runs in one pipeline (a single run goes
// without one), best effort.
func (n *Node) AbortBatch(ctx context.Context, runs []claim.Run, tokens []string) {
	if len(runs) == 1 {
		_ = n.Abort(ctx, runs[0], tokens[0])
		return
	}
	pipe := n.client.Pipeline()
	for i, run := range runs {
		id := run.ID()
		abortScript.Eval(ctx, pipe, []string{n.keys.run(id), n.keys.runs(run.Job)}, tokens[i], id)
	}
	_, _ = pipe.Exec(ctx)
}

// Renew extends the lease cl holds on the node to lease from now on the
// node's clock and returns the new deadline. It returns an error wrapping
// claim.ErrLeaseLost if cl's token no longer holds a live lease there, or
// holds one the server granted before it last restarted. With repair, a
// node that lost cl (or has it only from before a restart) is given it
// back, and Renew still returns ErrLeaseLost for that node: see
// package redlock.
func (n *Node) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration, repair bool) (time.Time, error) {
	id, job := cl.ID(), cl.Run.Job
	fix := ""
	if repair {
		fix = "1"
	}
	var vals []any
	err := n.pipeline(ctx, renewProgram, 1, func(int) ([]string, []any) {
		return []string{n.keys.run(id), n.keys.fence(job), n.keys.runs(job), n.keys.jobs(n.keys.bucket(job))},
			[]any{cl.Token, lease.Milliseconds(), n.doneTTL.Milliseconds(), fix, cl.Holder, cl.Fence, cl.Attempt,
				cl.Run.At.UTC().UnixMilli(), id, job}
	}, func(_ int, cmd *goredis.Cmd) (err error) {
		vals, err = cmd.Slice()
		return n.translate(ctx, err)
	})[0]
	if err != nil {
		return time.Time{}, err
	}
	r := reply(vals)
	switch r.str(0) {
	case "renewed":
		until := ms(r.int(1))
		return until, r.err
	case "repaired":
		return time.Time{}, fmt.Errorf("the node had lost the claim (given back): %w", claim.ErrLeaseLost)
	case "lost":
		return time.Time{}, fmt.Errorf("%s: %w", r.str(1), claim.ErrLeaseLost)
	}
	return time.Time{}, fmt.Errorf("redis: renew script replied %v", vals)
}

// ReleaseBatch ends the claims tokens hold on runIDs with outcomes, in
// batches of one script call each (see releaseScript), pipelined. A claim
// whose token no longer holds its run answers an error wrapping
// claim.ErrLeaseLost.
func (n *Node) ReleaseBatch(ctx context.Context, runIDs, tokens []string, outcomes []claim.Status) []error {
	answers := make([]error, len(runIDs))
	errs := n.batch(ctx, releaseProgram, len(runIDs), func(i int) string { return jobOf(runIDs[i]) },
		func(int) ([]string, []any) { return nil, []any{n.doneTTL.Milliseconds()} },
		func(i int, keys []string, args []any) ([]string, []any) {
			return append(keys, n.keys.run(runIDs[i])), append(args, tokens[i], string(outcomes[i]), terminal(outcomes[i]))
		}, func(_ int, chunk []int, vals []any) error {
			if len(vals) != len(chunk) {
				return fmt.Errorf("redis: release script replied %v to %d claims", vals, len(chunk))
			}
			for k, i := range chunk {
				answers[i] = releaseReply(vals[k])
			}
			return nil
		})
	for i, err := range errs {
		if err == nil {
			errs[i] = answers[i]
		}
	}
	return errs
}

// ErrGone is a release that found no record of its run at all: not
// taken over (that leaves the new holder's record), but lost with the
// server's keys (a FLUSHALL, an eviction, a restart without persistence)
// while it ran. See RecordGone.
var ErrGone = errors.New("no record of the run (the server lost it)")

// ErrMayEvict is Check's refusal of a server whose maxmemory-policy may
// evict keys, a claim among them.
var ErrMayEvict = errors.New("the server may evict a claim")

func releaseReply(v any) error {
	vals, _ := v.([]any)
	r := reply(vals)
	switch r.str(0) {
	case "released":
		return r.err
	case "lost":
		if r.str(1) == "no such run" {
			return fmt.Errorf("%w: %w", ErrGone, claim.ErrLeaseLost)
		}
		return fmt.Errorf("%s: %w", r.str(1), claim.ErrLeaseLost)
	case "error":
		return fmt.Errorf("redis: release script: %s", r.str(1))
	}
	return fmt.Errorf("redis: release script replied %v", v)
}

// Abort undoes a grant to token that will not be used: a fresh run
// disappears, a takeover returns to the attempt it replaced. It is a no-op
// if token no longer holds the run.
func (n *Node) Abort(ctx context.Context, run claim.Run, token string) error {
	id := run.ID()
	return n.translate(ctx, abortScript.Run(ctx, n.client,
		[]string{n.keys.run(id), n.keys.runs(run.Job)}, token, id).Err())
}

// CommitBatch raises, for each of runs, the job's fence key to at least
// fences[i] and, if tokens[i] still holds the run, records fences[i] and
// attempts[i] in it; it reports which runs were updated. The commits go in
// batches of one script call each (see commitScript), pipelined.
func (n *Node) CommitBatch(ctx context.Context, runs []claim.Run, tokens []string, fences []int64, attempts []int) ([]bool, []error) {
	updated := make([]bool, len(runs))
	answers := make([]error, len(runs))
	errs := n.batch(ctx, commitProgram, len(runs), func(i int) string { return runs[i].Job },
		func(int) ([]string, []any) { return nil, nil },
		func(i int, keys []string, args []any) ([]string, []any) {
			return append(keys, n.keys.run(runs[i].ID()), n.keys.fence(runs[i].Job)),
				append(args, tokens[i], fences[i], attempts[i])
		}, func(_ int, chunk []int, vals []any) error {
			if len(vals) != len(chunk) {
				return fmt.Errorf("redis: commit script replied %v to %d runs", vals, len(chunk))
			}
			for k, i := range chunk {
				switch v := vals[k].(type) {
				case int64:
					updated[i] = v == 1
				default:
					answers[i] = fmt.Errorf("redis: commit script replied %v", v)
				}
			}
			return nil
		})
	for i, err := range errs {
		if err == nil {
			errs[i] = answers[i]
		}
	}
	return updated, errs
}

// reply reads a script's array reply; the first malformed element sets err.
type replyReader struct {
	vals []any
	err  error
}

func reply(vals []any) *replyReader { return &replyReader{vals: vals} }

func (r *replyReader) str(i int) string {
	if i < len(r.vals) {
		if s, ok := r.vals[i].(string); ok {
			return s
		}
	}
	if r.err == nil {
		r.err = fmt.Errorf("redis: script reply %v: element %d is not a string", r.vals, i)
	}
	return ""
}

func (r *replyReader) int(i int) int64 {
	if i < len(r.vals) {
		if n, ok := r.vals[i].(int64); ok {
			return n
		}
	}
	if r.err == nil {
		r.err = fmt.Errorf("redis: script reply %v: element %d is not an integer", r.vals, i)
	}
	return 0
}

func terminal(o claim.Status) string {
	if o.Terminal() {
		return "1"
	}
	return "0"
}

func ms(v int64) time.Time { return time.UnixMilli(v).UTC() }

// TakeoversHeld reports whether this node's claims now take no lapsed
// lease over (claim.Unanswered), for leases of lease.
func (n *Node) TakeoversHeld(lease time.Duration) bool { return n.unanswered.Hold(lease) }

// Settle ends the hold the node started with (claim.Settler).
func (n *Node) Settle() { n.unanswered.Settle() }
