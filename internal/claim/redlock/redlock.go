// Package redlock is a claim.Claimer over N independent Redis servers: a
// claim is won on a majority (N/2+1) of them within the lease's validity
// time. Each server runs the same Lua scripts, with the same key layout, as
// package redis; this package only counts their votes.
//
// # Claim
//
// The claim script is sent to every node in parallel, each call bounded by
// a node timeout much shorter than the lease. The claim is won when a
// majority granted it and time is left: validity = lease − elapsed − drift,
// drift = lease/100 + 2ms (clock rate differences between the nodes and this
// process). The fence is the largest one the granting nodes issued, the
// attempt the largest attempt; a second, parallel round (commit) raises the
// job's fence key to that fence on every node that answered and writes the
// fence and attempt into the run on the granting nodes. Any majority formed
// later shares a node with this one, so its fences and attempts count on
// from there.
//
// Fences never collide: node i issues only fences congruent to i modulo 64,
// so the fences of two grants differ whether their maxima came from one node
// (which never repeats itself) or from two. This relies on every replica
// listing the nodes in the same order.
//
// A claim that is not won is undone on every node that granted it or did
// not answer (it may have granted late) with the abort script: a fresh run
// disappears, a takeover returns to the attempt it replaced. Then:
//
//   - a node saying done gives ErrDone, unless another node has seen a
//     later attempt. A node records a terminal outcome when a holder
//     releases the run there. A holder whose claim was taken over can still
//     do that on a node the takeover missed (its release then fails on the
//     majority), but that node's attempt is older than the successor's. A
//     done attempt at least as recent as every other node's means the run
//     ended, even if the release reached only a minority or other nodes
//     have lost the marker since, so it vetoes the grant. Otherwise the
//     done vote is stale and counts for nothing;
//   - fewer than a majority answering gives ErrUnavailable ("quorum not
//     reached: k of n nodes answered");
//   - another claim held on a majority gives ErrHeld;
//   - otherwise the vote was split between contenders and nobody won. A
//     claimer does not retry on the runner's behalf, but a split vote is no
//     answer at all: left alone, every contender would report ErrHeld and
//     nobody would run the job. So the round is tried again, at most three
//     more times within ctx: at once by the contender whose token digest is
//     the smallest among the votes, after one to two round-times plus up to
//     10ms by the others; then the split is reported as ErrHeld.
//
// Renew and Release go to every node and succeed on a majority; Renew also
// within the validity time.
//
// # Nodes that lose their data
//
// Nodes typically run without persistence. A node that restarts empty
// grants anything it is asked, but a newcomer still needs a majority: while
// at most a minority of nodes has lost the run, the others still say held
// (or done), so a held run is not granted twice and a done run is not run
// again. Fences do not go backwards either: a majority keeps the last fence,
// and an empty node starts again from its clock (package redis). If a
// majority loses its data within a lease (or within DoneTTL of a finished
// run), a run can execute twice. Nodes are not repaired: a claim that
// outlives the restarts of a majority of nodes, one after another, is
// exposed in the same way; long jobs on frequently restarted nodes should
// use persistence (appendonly) on the nodes.
//
// Each node's client must set ContextTimeoutEnabled, so that the node
// timeout bounds the call; MaxRetries -1 and DialerRetries 1 keep a dead
// node from spending the timeout on retries.
package redlock

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
)

const (
	// DefaultNodeTimeout bounds each node's answer; it is capped at lease/3.
	DefaultNodeTimeout = 100 * time.Millisecond
	// maxNodes is the fence modulus: node i issues fences ≡ i (mod maxNodes).
	maxNodes = 64
	// splitRetries and splitPause resolve a vote split between contenders.
	splitRetries = 3
	splitPause   = 10 * time.Millisecond
)

// Options configure a Claimer.
type Options struct {
	// Instance is the holder id written into claims.
	Instance string
	// Prefix, DoneTTL, HistoryLimit and AllowEviction are as in package
	// redis and apply on every node.
	Prefix        string
	DoneTTL       time.Duration
	HistoryLimit  int
	AllowEviction bool
	// NodeTimeout bounds each node's answer (default 100ms, at most
	// lease/3 so that a majority can answer within the validity time).
	NodeTimeout time.Duration
}

// Claimer is a claim.Claimer and claim.Historian over independent nodes.
type Claimer struct {
	nodes       []*redis.Node
	clients     []goredis.UniversalClient
	quorum      int
	instance    string
	nodeTimeout time.Duration
}

var (
	_ claim.Claimer   = (*Claimer)(nil)
	_ claim.Historian = (*Claimer)(nil)
)

// New returns a Claimer over one client per node, which it owns from now
// on: Close closes them. Every replica must list the nodes in the same
// order. An odd count of at least 3 is what tolerates failures; New accepts
// any count from 1 to 64 and leaves that advice to configuration.
func New(clients []goredis.UniversalClient, opts Options) (*Claimer, error) {
	if len(clients) == 0 || len(clients) > maxNodes {
		return nil, fmt.Errorf("redlock: %d nodes, want 1 to %d", len(clients), maxNodes)
	}
	c := &Claimer{
		clients: clients, quorum: len(clients)/2 + 1, instance: opts.Instance,
		nodeTimeout: cmp.Or(opts.NodeTimeout, DefaultNodeTimeout),
	}
	ropts := redis.Options{Instance: opts.Instance, Prefix: opts.Prefix, DoneTTL: opts.DoneTTL,
		HistoryLimit: opts.HistoryLimit, AllowEviction: opts.AllowEviction}
	for i, cl := range clients {
		if cl == nil {
			return nil, fmt.Errorf("redlock: node %d: nil client", i)
		}
		if rc, ok := cl.(*goredis.Client); ok && !rc.Options().ContextTimeoutEnabled {
			return nil, fmt.Errorf("redlock: node %d (%s): client must set ContextTimeoutEnabled so that the node timeout bounds each call",
				i, rc.Options().Addr)
		}
		c.nodes = append(c.nodes, redis.NewNode(cl, ropts, i, maxNodes))
	}
	return c, nil
}

// timeout is the per-node bound for a call made under lease.
func (c *Claimer) timeout(lease time.Duration) time.Duration {
	return min(c.nodeTimeout, lease/3)
}

// validity is how much of a lease requested at start is left, minus drift.
func validity(start time.Time, lease time.Duration) time.Duration {
	return lease - time.Since(start) - (lease/100 + 2*time.Millisecond)
}

// each calls f on every node in parallel, each under its own timeout, and
// returns when all have returned.
func (c *Claimer) each(ctx context.Context, timeout time.Duration, f func(ctx context.Context, i int, n *redis.Node)) {
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			f(nctx, i, n)
		})
	}
	wg.Wait()
}

// Claim implements claim.Claimer.
func (c *Claimer) Claim(ctx context.Context, run claim.Run, lease time.Duration) (*claim.Claim, error) {
	if err := claim.CheckClaim(run, lease); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	run.At = run.At.UTC()
	for round := 0; ; round++ {
		start := time.Now()
		cl, split, err := c.claimOnce(ctx, run, lease)
		if split == nil || round == splitRetries {
			return cl, err
		}
		pause := time.Duration(0)
		if !split.lead {
			// Leave the leader a clear round: one to two of our own round
			// times (which grow with load), plus jitter among the others.
			took := time.Since(start)
			pause = took + rand.N(took+splitPause)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err() // nobody holds the run: ErrHeld would mislead
		case <-t.C:
		}
	}
}

// split describes a vote nobody won; lead is set for the contender whose
// token digest was the smallest among the votes.
type split struct{ lead bool }

// claimOnce runs one round; a non-nil split reports a vote nobody won.
func (c *Claimer) claimOnce(ctx context.Context, run claim.Run, lease time.Duration) (_ *claim.Claim, _ *split, _ error) {
	token := claim.NewToken()
	id := run.ID()
	start := time.Now()
	timeout := c.timeout(lease)
	replies := make([]redis.Reply, len(c.nodes))
	errs := make([]error, len(c.nodes))
	c.each(ctx, timeout, func(ctx context.Context, i int, n *redis.Node) {
		replies[i], errs[i] = n.Claim(ctx, run, token, c.instance, lease)
	})

	// undo lists the nodes to abort on if the claim is not won: those that
	// granted, and those that did not answer, which may have granted late.
	var granted, undo []int
	var answered, heldVotes, maxHeld, doneVotes int
	// doneAt is the latest attempt a node recorded as done, newest the
	// latest attempt any other node recorded before this round.
	doneAt, newest := 0, 0
	held := map[string]int{} // votes per holding claim
	for i, r := range replies {
		if errs[i] != nil {
			undo = append(undo, i)
			continue
		}
		answered++
		switch r.Vote {
		case redis.Granted:
			granted = append(granted, i)
			undo = append(undo, i)
			newest = max(newest, r.Attempt-1)
		case redis.Done:
			doneVotes++
			doneAt = max(doneAt, r.Attempt)
		case redis.Held:
			heldVotes++
			held[r.HolderKey]++
			maxHeld = max(maxHeld, held[r.HolderKey])
			newest = max(newest, r.Attempt)
		}
	}
	done := doneVotes > 0 && doneAt >= newest
	if ctx.Err() != nil {
		c.abort(ctx, run, token, undo)
		return nil, nil, ctx.Err()
	}

	var why string
	if !done && len(granted) >= c.quorum {
		cl, err := c.commit(ctx, run, token, lease, start, granted, replies, errs)
		if err == nil {
			return cl, nil, nil
		}
		if ctx.Err() != nil {
			c.abort(ctx, run, token, undo)
			return nil, nil, ctx.Err()
		}
		why = err.Error()
	}
	c.abort(ctx, run, token, undo)

	votes := fmt.Sprintf("%d granted, %d held, %d done, %d of %d nodes answered",
		len(granted), heldVotes, doneVotes, answered, len(c.nodes))
	switch {
	case done:
		return nil, nil, fmt.Errorf("claim %s: %s: %w", id, votes, claim.ErrDone)
	case answered < c.quorum:
		return nil, nil, fmt.Errorf("claim %s: quorum not reached: %d of %d nodes answered: %w (%s)",
			id, answered, len(c.nodes), claim.ErrUnavailable, reasons(errs))
	case why != "":
		return nil, nil, fmt.Errorf("claim %s: %s, but %s: %w", id, votes, why, claim.ErrUnavailable)
	case maxHeld >= c.quorum:
		return nil, nil, fmt.Errorf("claim %s: %s: %w", id, votes, claim.ErrHeld)
	}
	lead, mine := len(granted) > 0, redis.TokenKey(token)
	for k := range held {
		lead = lead && mine < k
	}
	return nil, &split{lead: lead}, fmt.Errorf("claim %s: split vote: %s: %w", id, votes, claim.ErrHeld)
}

// commit fixes the fence and attempt of a claim granted by a majority and
// checks that it still holds a majority within the validity time.
func (c *Claimer) commit(ctx context.Context, run claim.Run, token string, lease time.Duration,
	start time.Time, granted []int, replies []redis.Reply, errs []error) (*claim.Claim, error) {
	var fence int64
	var attempt int
	for _, i := range granted {
		fence, attempt = max(fence, replies[i].Fence), max(attempt, replies[i].Attempt)
	}
	committed := make([]bool, len(c.nodes))
	c.each(ctx, c.timeout(lease), func(ctx context.Context, i int, n *redis.Node) {
		if errs[i] == nil { // every node that answered keeps the fence; granting ones the attempt
			committed[i], _ = n.Commit(ctx, run, token, fence, attempt)
		}
	})
	var deadline time.Time
	held := 0
	for _, i := range granted {
		if committed[i] {
			held++
			if deadline.IsZero() || replies[i].LeaseUntil.Before(deadline) {
				deadline = replies[i].LeaseUntil
			}
		}
	}
	if held < c.quorum {
		return nil, fmt.Errorf("committed on %d of %d nodes", held, len(c.nodes))
	}
	if v := validity(start, lease); v <= 0 {
		return nil, fmt.Errorf("no validity left after %v of a %v lease", time.Since(start).Round(time.Millisecond), lease)
	}
	return &claim.Claim{
		Run: run, Token: token, Holder: c.instance, Fence: fence, Attempt: attempt,
		Deadline: deadline, Requested: start, Lease: lease,
	}, nil
}

// abort undoes any grant to token on nodes, even if ctx is done: a grant
// left behind would hold its node's vote for a whole lease.
func (c *Claimer) abort(ctx context.Context, run claim.Run, token string, nodes []int) {
	if len(nodes) == 0 {
		return
	}
	on := make([]bool, len(c.nodes))
	for _, i := range nodes {
		on[i] = true
	}
	c.each(context.WithoutCancel(ctx), c.nodeTimeout, func(ctx context.Context, i int, n *redis.Node) {
		if on[i] {
			_ = n.Abort(ctx, run, token) // best effort: the lease bounds what is left
		}
	})
}

// ClientOptions are the settings a node's client needs: the node timeout
// bounds every call (ContextTimeoutEnabled), and a dead node costs one
// failed vote, not go-redis's own retries, which the validity time has no
// room for.
func ClientOptions(addr string) *goredis.Options {
	return &goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1}
}
