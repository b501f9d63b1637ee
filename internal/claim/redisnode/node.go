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
	// Restarted, if set, is called when a script reports another run_id
	// than the last one: the server restarted (redis.Claimer's write-back).
	Restarted func()
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
	allowEviction bool
	slot, slots   int64
	addr          string // the server's address, where the client tells it
	// seen is the run_id of the server incarnation a claim script last ran
	// on: the script tells a marker that vanished under it (keys deleted)
	// from a new namespace by it.
	seen atomic.Pointer[string]
	// restarted is Options.Restarted.
	restarted func()
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
		client: client, keys: keys{opts.Prefix}, doneTTL: opts.DoneTTL,
		historyLimit: opts.HistoryLimit, allowEviction: opts.AllowEviction,
		slot: int64(slot), slots: int64(slots), restarted: opts.Restarted,
	}
	if cl, ok := client.(*goredis.Client); ok {
		n.addr = cl.Options().Addr
	}
	return n
}

// DoneTTL is how long a run's hash outlives its lease or release.
func (n *Node) DoneTTL() time.Duration { return n.doneTTL }

// Addr is the server's address, or "" if the client does not tell.
func (n *Node) Addr() string { return n.addr }

// keys builds the key layout. Run ids are injective (claim.Run.ID), and the
// four namespaces differ before the variable part ("run:" vs "runs:"), so
// distinct runs and jobs never share a key.
type keys struct{ prefix string }

func (k keys) run(id string) string    { return k.prefix + "run:" + id }
func (k keys) fence(job string) string { return k.prefix + "fence:" + job }
func (k keys) runs(job string) string  { return k.prefix + "runs:" + job }
func (k keys) jobs() string            { return k.prefix + "jobs" }
func (k keys) marker() string          { return k.prefix + "server" }

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
	Fence      int64        // Granted
	Attempt    int          // Granted: the attempt granted; Held, Done: the attempt recorded
	LeaseUntil time.Time    // Granted, Held
	Holder     string       // Held: the holder's instance
	HolderKey  string       // Held: TokenKey of the holder's token
	Status     claim.Status // Done
	// Restarted is set on a Held reply given because the server lost its
	// data: the restart guard began at LostAt and holds every run until
	// LeaseUntil.
	Restarted bool
	LostAt    time.Time
}

// TokenKey is the digest a Held reply carries for the holder's token (the
// first 16 hex digits of its SHA-1), so that votes can be grouped by grant
// without handing out tokens.
func TokenKey(token string) string {
	sum := sha1.Sum([]byte(token))
	return hex.EncodeToString(sum[:8])
}

func (n *Node) claimArgs(run claim.Run, token, holder string, lease time.Duration) ([]string, []any) {
	id := run.ID()
	return []string{n.keys.run(id), n.keys.fence(run.Job), n.keys.runs(run.Job), n.keys.jobs(), n.keys.marker()},
		[]any{token, holder, lease.Milliseconds(), n.doneTTL.Milliseconds(), run.At.UnixMilli(), id, run.Job,
			n.historyLimit, n.slot, n.slots, n.seenID()}
}

// Seen is the run_id this node's scripts last reported ("" if none ran
// yet): the server incarnation its latest claims and releases went to.
func (n *Node) Seen() string { return n.seenID() }

func (n *Node) seenID() string {
	if p := n.seen.Load(); p != nil {
		return *p
	}
	return ""
}

// ran records the run_id a script reported: the namespace's marker now
// names it, unless the server loses its data.
func (n *Node) ran(id string) {
	if old := n.seen.Swap(&id); old != nil && *old != id && n.restarted != nil {
		n.restarted()
	}
}

func (n *Node) claimReply(vals []any) (Reply, error) {
	r := reply(vals)
	if len(vals) > 0 {
		if id := r.str(len(vals) - 1); r.err == nil {
			n.ran(id)
		}
	}
	var out Reply
	switch r.str(0) {
	case "restarted":
		out = Reply{Vote: Held, Restarted: true, LostAt: ms(r.int(1)), LeaseUntil: ms(r.int(2))}
	case "granted":
		out = Reply{Vote: Granted, Fence: r.int(1), Attempt: int(r.int(2)), LeaseUntil: ms(r.int(3))}
	case "held":
		out = Reply{Vote: Held, Holder: r.str(1), LeaseUntil: ms(r.int(2)), HolderKey: r.str(3), Attempt: int(r.int(4))}
	case "done":
		out = Reply{Vote: Done, Status: claim.Status(r.str(1)), Attempt: int(r.int(2))}
	default:
		return Reply{}, fmt.Errorf("redis: claim script replied %v", vals)
	}
	if r.err != nil {
		return Reply{}, r.err
	}
	return out, nil
}

// ClaimBatch asks the node to grant each of runs to its token for lease,
// in one pipeline (a single run goes without one). Each run is one atomic
// script.
func (n *Node) ClaimBatch(ctx context.Context, runs []claim.Run, tokens []string, holder string, lease time.Duration) ([]Reply, []error) {
	replies := make([]Reply, len(runs))
	errs := n.pipeline(ctx, claimScript, len(runs), func(i int) ([]string, []any) {
		return n.claimArgs(runs[i], tokens[i], holder, lease)
	}, func(i int, cmd *goredis.Cmd) error {
		vals, err := cmd.Slice()
		if err != nil {
			return translate(ctx, err)
		}
		replies[i], err = n.claimReply(vals)
		return err
	})
	return replies, errs
}

// pipeline runs script count times in one pipeline, with the keys and
// arguments args gives for each, and hands each reply to read; it returns
// each run's error (a second pipeline loads the script if the server lost
// it). A single run is sent without a pipeline, as a bare script call.
func (n *Node) pipeline(ctx context.Context, script *goredis.Script, count int,
	args func(i int) ([]string, []any), read func(i int, cmd *goredis.Cmd) error) []error {
	errs := make([]error, count)
	if count == 1 {
		keys, argv := args(0)
		cmd := script.Run(ctx, n.client, keys, argv...) // EVALSHA, then EVAL if the server lost the script
		if err := cmd.Err(); err != nil {
			errs[0] = translate(ctx, err)
		} else {
			errs[0] = read(0, cmd)
		}
		return errs
	}
	todo := make([]int, count)
	for i := range todo {
		todo[i] = i
	}
	for try := 0; len(todo) > 0; try++ {
		pipe := n.client.Pipeline()
		cmds := make([]*goredis.Cmd, len(todo))
		for k, i := range todo {
			keys, argv := args(i)
			cmds[k] = script.EvalSha(ctx, pipe, keys, argv...)
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		var again []int
		for k, i := range todo {
			err := cmds[k].Err()
			switch {
			case err != nil && try == 0 && goredis.HasErrorPrefix(err, "NOSCRIPT"):
				again = append(again, i)
			case err != nil:
				errs[i] = translate(ctx, err)
			default:
				errs[i] = read(i, cmds[k])
			}
		}
		if len(again) > 0 {
			if err := script.Load(ctx, n.client).Err(); err != nil {
				for _, i := range again {
					errs[i] = translate(ctx, err)
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
	vals, err := renewScript.Run(ctx, n.client,
		[]string{n.keys.run(id), n.keys.fence(job), n.keys.runs(job), n.keys.jobs()},
		cl.Token, lease.Milliseconds(), n.doneTTL.Milliseconds(), fix, cl.Holder, cl.Fence, cl.Attempt,
		cl.Run.At.UTC().UnixMilli(), id, job).Slice()
	if err != nil {
		return time.Time{}, translate(ctx, err)
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

// ReleaseBatch ends the claims tokens hold on runIDs with outcomes, in one
// pipeline (a single claim goes without one). A claim whose token no
// longer holds its run answers an error wrapping claim.ErrLeaseLost.
func (n *Node) ReleaseBatch(ctx context.Context, runIDs, tokens []string, outcomes []claim.Status) []error {
	return n.pipeline(ctx, releaseScript, len(runIDs), func(i int) ([]string, []any) {
		return n.releaseArgs(runIDs[i], tokens[i], outcomes[i])
	}, func(_ int, cmd *goredis.Cmd) error {
		vals, err := cmd.Slice()
		if err != nil {
			return translate(ctx, err)
		}
		return releaseReply(vals)
	})
}

func (n *Node) releaseArgs(runID, token string, o claim.Status) ([]string, []any) {
	return []string{n.keys.run(runID)}, []any{token, string(o), n.doneTTL.Milliseconds(), terminal(o)}
}

func releaseReply(vals []any) error {
	r := reply(vals)
	switch r.str(0) {
	case "released":
		return r.err
	case "lost":
		return fmt.Errorf("%s: %w", r.str(1), claim.ErrLeaseLost)
	}
	return fmt.Errorf("redis: release script replied %v", vals)
}

// Abort undoes a grant to token that will not be used: a fresh run
// disappears, a takeover returns to the attempt it replaced. It is a no-op
// if token no longer holds the run.
func (n *Node) Abort(ctx context.Context, run claim.Run, token string) error {
	id := run.ID()
	return translate(ctx, abortScript.Run(ctx, n.client,
		[]string{n.keys.run(id), n.keys.runs(run.Job)}, token, id).Err())
}

// CommitBatch raises, for each of runs, the job's fence key to at least
// fences[i] and, if tokens[i] still holds the run, records fences[i] and
// attempts[i] in it; it reports which runs were updated. The commits go in
// one pipeline (a single run goes without one).
func (n *Node) CommitBatch(ctx context.Context, runs []claim.Run, tokens []string, fences []int64, attempts []int) ([]bool, []error) {
	updated := make([]bool, len(runs))
	errs := n.pipeline(ctx, commitScript, len(runs), func(i int) ([]string, []any) {
		return n.commitArgs(runs[i], tokens[i], fences[i], attempts[i])
	}, func(i int, cmd *goredis.Cmd) error {
		v, err := cmd.Int()
		updated[i] = v == 1
		return translate(ctx, err)
	})
	return updated, errs
}

func (n *Node) commitArgs(run claim.Run, token string, fence int64, attempt int) ([]string, []any) {
	return []string{n.keys.run(run.ID()), n.keys.fence(run.Job)}, []any{token, fence, attempt}
}

// Ping reports whether the server answers.
func (n *Node) Ping(ctx context.Context) error {
	return translate(ctx, n.client.Ping(ctx).Err())
}

// Check refuses a server that may evict keys: with maxmemory set and any
// maxmemory-policy but noeviction, Redis may drop a claim under memory
// pressure and the run would execute twice. It reads INFO, which managed
// services that disable CONFIG still serve.
func (n *Node) Check(ctx context.Context) error {
	if _, ok := n.client.(*goredis.ClusterClient); ok {
		return errors.New("redis: Redis Cluster is not supported: a claim updates keys in several hash slots atomically")
	}
	info, err := n.client.Info(ctx, "memory").Result()
	if err != nil {
		return translate(ctx, err)
	}
	var maxmemory int64
	policy := ""
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "maxmemory":
			maxmemory, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory_policy":
			policy = v
		}
	}
	if maxmemory > 0 && policy != "noeviction" && !n.allowEviction {
		return fmt.Errorf("redis: maxmemory is %d bytes with maxmemory-policy %q: the server may evict a claim "+
			"and let a run execute twice; set maxmemory-policy noeviction (or maxmemory 0), or allow eviction "+
			"explicitly to accept that risk", maxmemory, policy)
	}
	return nil
}

// translate maps a go-redis error onto the claim contract, in one place.
// The caller's cancellation comes back unchanged, never as a sentinel;
// anything that says the server cannot serve us now (no connection, a
// timeout, LOADING, READONLY, OOM, auth) is claim.ErrUnavailable; other
// server replies are bugs and are returned as they are. go-redis errors
// carry addresses, never passwords.
func translate(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		// Whatever the client saw (a deadline on the socket, a dropped
		// connection) followed from the caller giving up.
		return ctx.Err()
	case errors.Is(err, goredis.Nil):
		// No script replies nil and no command used here returns it.
		return fmt.Errorf("redis: unexpected nil reply")
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) && !serverUnavailable(err) {
		return err
	}
	// %v, not %w: a timeout inside the client is not the caller's deadline.
	return fmt.Errorf("%w: %v", claim.ErrUnavailable, err)
}

func serverUnavailable(err error) bool {
	return goredis.IsLoadingError(err) || goredis.IsReadOnlyError(err) || goredis.IsMasterDownError(err) ||
		goredis.IsClusterDownError(err) || goredis.IsTryAgainError(err) || goredis.IsMaxClientsError(err) ||
		goredis.IsOOMError(err) || goredis.IsAuthError(err) || goredis.IsPermissionError(err) ||
		goredis.HasErrorPrefix(err, "BUSY")
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
