package redlock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

const (
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
	// NodeTimeout bounds each node's answer; required (claimer.redlock.
	// node_timeout, whose default is in the config's table), and capped at
	// lease/3 so that a majority can answer within the validity time.
	NodeTimeout time.Duration
}

// Claimer is a claim.Claimer over independent nodes.
type Claimer struct {
	nodes       []*redisnode.Node
	clients     []goredis.UniversalClient
	quorum      int
	instance    string
	nodeTimeout time.Duration
	// claims and releases merge the batches of callers who come at once.
	claims   claim.ClaimCoalescer
	releases claim.ReleaseCoalescer
	// bids are the runs whose last round left grants that may outlive
	// their undo (claim.Bids): a node that missed the undo grants the
	// next round its own lost grant, and need not sit the lease out.
	bids claim.Bids
	// reads are the history reads still out on nodes a read stopped
	// waiting for (readNodes).
	reads sync.WaitGroup
}

var _ claim.Claimer = (*Claimer)(nil)

// New returns a Claimer over one client per node, which it owns from now
// on: Close closes them. Every replica must list the nodes in the same
// order. An odd count of at least 3 is what tolerates failures; New accepts
// any count from 1 to 64 and leaves that advice to configuration.
func New(clients []goredis.UniversalClient, opts Options) (*Claimer, error) {
	switch {
	case len(clients) == 0 || len(clients) > maxNodes:
		return nil, fmt.Errorf("redlock: %d nodes, want 1 to %d", len(clients), maxNodes)
	case opts.NodeTimeout <= 0:
		return nil, fmt.Errorf("redlock: node timeout %v must be positive", opts.NodeTimeout)
	}
	c := &Claimer{
		clients: clients, quorum: len(clients)/2 + 1, instance: opts.Instance,
		nodeTimeout: opts.NodeTimeout,
	}
	nopts := redisnode.Options{Prefix: opts.Prefix, DoneTTL: opts.DoneTTL,
		HistoryLimit: opts.HistoryLimit, AllowEviction: opts.AllowEviction}
	for i, cl := range clients {
		if cl == nil {
			return nil, fmt.Errorf("redlock: node %d: nil client", i)
		}
		if _, ok := cl.(*goredis.ClusterClient); ok {
			return nil, fmt.Errorf("redlock: node %d: a Redis Cluster client; Redlock counts votes of independent servers, one plain client each", i)
		}
		if rc, ok := cl.(*goredis.Client); ok && !rc.Options().ContextTimeoutEnabled {
			return nil, fmt.Errorf("redlock: node %d (%s): client must set ContextTimeoutEnabled so that the node timeout bounds each call",
				i, rc.Options().Addr)
		}
		c.nodes = append(c.nodes, redisnode.New(cl, nopts, i, maxNodes))
	}
	return c, nil
}

// timeout is the per-node bound for a call made under lease.
func (c *Claimer) timeout(lease time.Duration) time.Duration {
	return min(c.nodeTimeout, lease/3)
}

// perRunTimeout is what each run after the first adds to a node's bound
// in a batch. A node runs a pipeline's scripts one after another, and the
// client encodes and decodes each: with a bound that did not grow, a large
// batch would time out on every node, every time (measured: three replicas
// racing 1,000-run batches on five nodes under -race on two busy cores
// took 0.9–3.4s for the whole batch Claim, several rounds). A dead node
// costs a 1,000-run round about 2s of a lease's validity.
const perRunTimeout = 2 * time.Millisecond

// batchTimeout is bound grown for a batch of runs, still at most lease/3
// when lease is set.
func batchTimeout(bound time.Duration, runs int, lease time.Duration) time.Duration {
	d := bound + time.Duration(max(runs-1, 0))*perRunTimeout
	if lease > 0 {
		d = min(d, lease/3)
	}
	return d
}

// validity is how much of a lease requested at start is left, minus drift.
func validity(start time.Time, lease time.Duration) time.Duration {
	return lease - time.Since(start) - (lease/100 + 2*time.Millisecond)
}

// each calls f on every node in parallel, each under its own timeout, and
// returns when all have returned.
func (c *Claimer) each(ctx context.Context, timeout time.Duration, f func(ctx context.Context, i int, n *redisnode.Node)) {
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

// readNodes asks every node at once for a read whose answers History
// merges, and returns each node's answer and error. Once a majority has
// answered, the others get as long again as that took plus nodeTimeout,
// not the rest of timeout: a stalled minority (nodes SIGSTOPped, in a GC)
// cost every overlap probe the whole timeout, a second at the least, and
// a run waiting on probes started seconds late (found by an outside
// review: 8.7s late behind two of five paused nodes). A node cut short
// counts as one that did not answer; the merge does without it as
// without a node that is down (any majority of answers meets every
// grant's majority). Its call runs on to its own deadline in the
// background, and Close waits for it.
func readNodes[T any](ctx context.Context, c *Claimer, timeout time.Duration, f func(context.Context, *redisnode.Node) (T, error)) ([]T, []error) {
	return quorumNodes(ctx, c, timeout, func(ctx context.Context, _ int, n *redisnode.Node) (T, error) { return f(ctx, n) })
}

// quorumNodes calls f for every node at once, each bounded by timeout, and
// returns each node's answer and error, cutting the nodes that have not
// answered short once a majority has, as readNodes does. A claim round
// and a commit need a majority too, and waiting for a stalled minority
// cost each the whole bound, which grows with the batch: 300 runs due at
// once on five nodes, two stopped, started 1.5s late, and the next
// instant was skipped for overlap in 291 of 300 jobs (an outside review).
// The grace of as long again as the majority took keeps healthy nodes
// that answer a large batch a little later than the others.
func quorumNodes[T any](ctx context.Context, c *Claimer, timeout time.Duration, f func(context.Context, int, *redisnode.Node) (T, error)) ([]T, []error) {
	type answer struct {
		i   int
		v   T
		err error
	}
	start := time.Now()
	answers := make(chan answer, len(c.nodes))
	for i, n := range c.nodes {
		c.reads.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			v, err := f(nctx, i, n)
			answers <- answer{i, v, err}
		})
	}
	vs, errs := make([]T, len(c.nodes)), make([]error, len(c.nodes))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: node %s: no answer within %v of a majority's", claim.ErrUnavailable, c.nodes[i].Addr(), c.nodeTimeout)
	}
	var grace <-chan time.Time
	for got, ok := 0, 0; got < len(c.nodes); {
		select {
		case a := <-answers:
			got++
			vs[a.i], errs[a.i] = a.v, a.err
			if a.err == nil {
				if ok++; ok == c.quorum {
					t := time.NewTimer(time.Since(start) + c.nodeTimeout)
					defer t.Stop()
					grace = t.C
				}
			}
		case <-grace:
			return vs, errs
		}
	}
	return vs, errs
}

// Claim implements claim.Claimer: every round carries all the runs,
// pipelined to each node (claim scripts, then commits, then aborts), so a
// batch costs the round trips of one run. Each run is decided on its own
// votes. Claims made from several goroutines at once, under the same
// lease, are merged into such batches (claim.ClaimCoalescer).
func (c *Claimer) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	return c.claims.Claim(ctx, runs, lease, func(ctx context.Context, runs []claim.Run) []claim.Answer {
		bids := make([]*bid, len(runs))
		for k, run := range runs {
			bids[k] = &bid{run: run}
		}
		c.contend(ctx, bids, lease)
		out := make([]claim.Answer, len(bids))
		for k, b := range bids {
			out[k] = claim.Answer{Claim: b.cl, Err: b.err}
		}
		return out
	}, func(ctx context.Context, granted []*claim.Claim) {
		// Won for callers who left: undone, and where the undo is lost,
		// the next claim of a run takes the grant (claim.Bids).
		runs, tokens := claim.RunsAndTokens(granted)
		c.bids.OpenAll(runs, tokens, time.Now().Add(lease))
		c.each(ctx, batchTimeout(c.nodeTimeout, len(runs), 0), func(ctx context.Context, _ int, n *redisnode.Node) {
			n.AbortBatch(ctx, runs, tokens)
		})
	})
}

// bid is one run in a claim round, and what the round made of it: a
// claim, a split vote, or an error.
type bid struct {
	run   claim.Run
	token string
	cl    *claim.Claim
	split *split
	err   error

	retries int       // split votes retried so far
	next    time.Time // when a retry may go
}

// split describes a vote nobody won; lead is set for the contender whose
// token digest was the smallest among the votes.
type split struct{ lead bool }

// contend runs claim rounds until every bid has its answer. A split vote is
// tried again, at most splitRetries times within ctx: at once by the leader,
// after one to two of our own round times (which grow with load) plus
// jitter by the others, so that the leader gets a clear round. Bids due at
// the same moment share a round.
func (c *Claimer) contend(ctx context.Context, bids []*bid, lease time.Duration) {
	pending := bids
	for len(pending) > 0 {
		now := time.Now()
		var due, later []*bid
		first := pending[0].next
		for _, b := range pending {
			if b.next.After(now) {
				later = append(later, b)
				first = minTime(first, b.next)
			} else {
				due = append(due, b)
			}
		}
		if len(due) == 0 {
			t := time.NewTimer(first.Sub(now))
			select {
			case <-ctx.Done():
				t.Stop()
				for _, b := range later {
					b.split, b.err = nil, ctx.Err() // nobody holds the run: ErrHeld would mislead
				}
				return
			case <-t.C:
			}
			continue
		}
		start := time.Now()
		c.round(ctx, due, lease)
		took := time.Since(start)
		pending = later
		for _, b := range due {
			if b.split == nil || b.retries == splitRetries {
				continue
			}
			b.retries++
			b.next = time.Now()
			if !b.split.lead {
				b.next = b.next.Add(took + rand.N(took+splitPause))
			}
			pending = append(pending, b)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// votes is what the nodes said about one bid in a round.
type votes struct {
	// undo lists the nodes to abort on if the claim is not won: those that
	// granted, and those that did not answer, which may have granted late.
	granted, undo                      []int
	answered, held, maxHeld, doneVotes int
	done                               bool
	holders                            map[string]int // votes per holding claim
	// restarted lists the nodes that abstained because they lost their
	// data (held by their restart guard) and guardUntil when the last
	// guard ends; they count as held but for no holder.
	restarted  []int
	guardUntil time.Time
}

// tallyVotes counts the nodes' replies to bid k.
func (c *Claimer) tallyVotes(k int, replies [][]redisnode.Reply, errs [][]error) votes {
	v := votes{holders: map[string]int{}}
	// doneAt is the latest attempt a node recorded as done, newest the
	// latest attempt any other node recorded before this round.
	doneAt, newest := 0, 0
	for i := range c.nodes {
		if errs[i][k] != nil {
			v.undo = append(v.undo, i)
			continue
		}
		v.answered++
		switch r := replies[i][k]; r.Vote {
		case redisnode.Granted:
			v.granted = append(v.granted, i)
			v.undo = append(v.undo, i)
			newest = max(newest, r.Attempt-1)
		case redisnode.Done:
			v.doneVotes++
			doneAt = max(doneAt, r.Attempt)
		case redisnode.Held:
			v.held++
			if r.Restarted {
				v.restarted = append(v.restarted, i)
				v.guardUntil = maxTime(v.guardUntil, r.LeaseUntil)
				continue
			}
			v.holders[r.HolderKey]++
			v.maxHeld = max(v.maxHeld, v.holders[r.HolderKey])
			newest = max(newest, r.Attempt)
		}
	}
	v.done = v.doneVotes > 0 && doneAt >= newest
	return v
}

// round sends one claim round for bids to every node, in one pipeline per
// node when there are several, and gives each bid its answer.
func (c *Claimer) round(ctx context.Context, bids []*bid, lease time.Duration) {
	start := time.Now()
	runs, tokens := make([]claim.Run, len(bids)), make([]string, len(bids))
	for k, b := range bids {
		b.token, b.cl, b.split, b.err = c.bids.Token(b.run), nil, nil, nil
		runs[k], tokens[k] = b.run, b.token
	}
	type nodeReplies struct {
		replies []redisnode.Reply
		errs    []error
	}
	answers, cut := quorumNodes(ctx, c, batchTimeout(c.timeout(lease), len(bids), lease), func(ctx context.Context, _ int, n *redisnode.Node) (nodeReplies, error) {
		r, errs := n.ClaimBatch(ctx, runs, tokens, c.instance, lease)
		return nodeReplies{r, errs}, firstIfAll(errs)
	})
	replies := make([][]redisnode.Reply, len(c.nodes)) // by node, then bid
	errs := make([][]error, len(c.nodes))
	for i, a := range answers {
		replies[i], errs[i] = a.replies, a.errs
		if a.errs == nil { // cut short: no answer to any bid
			replies[i], errs[i] = make([]redisnode.Reply, len(bids)), make([]error, len(bids))
			for k := range errs[i] {
				errs[i][k] = cut[i]
			}
		}
	}
	tallies := make([]votes, len(bids))
	var winners []int
	for k := range bids {
		tallies[k] = c.tallyVotes(k, replies, errs)
		if !tallies[k].done && len(tallies[k].granted) >= c.quorum {
			winners = append(winners, k)
		}
	}
	var whys []string
	if ctx.Err() == nil {
		whys = c.commit(ctx, bids, winners, tallies, replies, errs, start, lease)
	}
	c.abort(ctx, bids, tallies)
	until := time.Now().Add(lease)
	for k, b := range bids {
		if b.cl != nil {
			continue
		}
		if len(tallies[k].undo) > 0 {
			c.bids.Open(b.run, b.token, until)
		}
		if err := ctx.Err(); err != nil {
			b.err = err
			continue
		}
		b.split, b.err = c.decide(b, tallies[k], whys[k], column(errs, k))
	}
}

// firstIfAll is errs[0] if every call of a node's batch failed (the node
// did not answer), else nil.
func firstIfAll(errs []error) error {
	for _, err := range errs {
		if err == nil {
			return nil
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}

// column is one bid's error from every node.
func column(errs [][]error, k int) []error {
	out := make([]error, len(errs))
	for i := range errs {
		out[i] = errs[i][k]
	}
	return out
}

// decide turns the votes on a bid that was not won into the contract's
// answer, or a split vote (which contend may try again).
func (c *Claimer) decide(b *bid, v votes, why string, errs []error) (*split, error) {
	id := b.run.ID()
	tally := fmt.Sprintf("%d granted, %d held, %d done, %d of %d nodes answered",
		len(v.granted), v.held, v.doneVotes, v.answered, len(c.nodes))
	if len(v.restarted) > 0 {
		tally += fmt.Sprintf(", %d of them abstaining after losing their data", len(v.restarted))
	}
	switch {
	case v.done:
		return nil, fmt.Errorf("claim %s: %s: %w", id, tally, claim.ErrDone)
	case v.answered < c.quorum:
		return nil, fmt.Errorf("claim %s: quorum not reached: %d of %d nodes answered: %w (%s)",
			id, v.answered, len(c.nodes), claim.ErrUnavailable, reasons(errs))
	case why != "":
		return nil, fmt.Errorf("claim %s: %s, but %s: %w", id, tally, why, claim.ErrUnavailable)
	case v.maxHeld >= c.quorum:
		return nil, fmt.Errorf("claim %s: %s: %w", id, tally, claim.ErrHeld)
	case v.answered-len(v.restarted) < c.quorum:
		// Nodes that lost their data abstain for a lease, and without
		// them no majority can form: held, and the operator hears why.
		var addrs []string
		for _, i := range v.restarted {
			addrs = append(addrs, c.nodes[i].Addr())
		}
		loss := &claim.DataLossError{Backend: "redlock node(s) " + strings.Join(addrs, ", "), Until: v.guardUntil}
		return nil, fmt.Errorf("claim %s: %s: %w: %w", id, tally, loss, claim.ErrHeld)
	}
	lead, mine := len(v.granted) > 0, redisnode.TokenKey(b.token)
	for k := range v.holders {
		lead = lead && mine < k
	}
	return &split{lead: lead}, fmt.Errorf("claim %s: split vote: %s: %w", id, tally, claim.ErrHeld)
}

// commit fixes the fence and attempt of every bid a majority granted, in
// one round, and checks that each still holds a majority within the
// validity time; it sets the claim of each that does and returns, per bid,
// why a winner's claim did not stand ("" otherwise).
func (c *Claimer) commit(ctx context.Context, bids []*bid, winners []int, tallies []votes,
	replies [][]redisnode.Reply, errs [][]error, start time.Time, lease time.Duration) []string {
	whys := make([]string, len(bids))
	if len(winners) == 0 {
		return whys
	}
	fences, attempts := make([]int64, len(bids)), make([]int, len(bids))
	for _, k := range winners {
		for _, i := range tallies[k].granted {
			fences[k], attempts[k] = max(fences[k], replies[i][k].Fence), max(attempts[k], replies[i][k].Attempt)
		}
	}
	committed, _ := quorumNodes(ctx, c, batchTimeout(c.timeout(lease), len(winners), lease), func(ctx context.Context, i int, n *redisnode.Node) ([]bool, error) {
		committed := make([]bool, len(bids))
		// Every node that answered keeps the fence; granting ones the attempt.
		var (
			ks     []int
			runs   []claim.Run
			tokens []string
			fs     []int64
			ats    []int
		)
		for _, k := range winners {
			if errs[i][k] == nil {
				ks, runs, tokens = append(ks, k), append(runs, bids[k].run), append(tokens, bids[k].token)
				fs, ats = append(fs, fences[k]), append(ats, attempts[k])
			}
		}
		if len(ks) == 0 {
			return committed, nil
		}
		ok, errs := n.CommitBatch(ctx, runs, tokens, fs, ats)
		for j, k := range ks {
			committed[k] = ok[j]
		}
		return committed, firstIfAll(errs)
	})
	left := validity(start, lease)
	for _, k := range winners {
		var deadline time.Time
		held := 0
		for _, i := range tallies[k].granted {
			if committed[i] != nil && committed[i][k] {
				held++
				if deadline.IsZero() || replies[i][k].LeaseUntil.Before(deadline) {
					deadline = replies[i][k].LeaseUntil
				}
			}
		}
		switch {
		case held < c.quorum:
			whys[k] = fmt.Sprintf("committed on %d of %d nodes", held, len(c.nodes))
		case left <= 0:
			whys[k] = fmt.Sprintf("no validity left after %v of a %v lease", time.Since(start).Round(time.Millisecond), lease)
		default:
			bids[k].cl = &claim.Claim{
				Run: bids[k].run, Token: bids[k].token, Holder: c.instance, Fence: fences[k], Attempt: attempts[k],
				Deadline: deadline, Requested: start, Lease: lease,
			}
		}
	}
	return whys
}

// abort undoes, on the nodes that granted them or did not answer, the bids
// that were not won, even if ctx is done: a grant left behind would hold
// its node's vote for a whole lease.
func (c *Claimer) abort(ctx context.Context, bids []*bid, tallies []votes) {
	runs, tokens := make([][]claim.Run, len(c.nodes)), make([][]string, len(c.nodes))
	some := false
	for k, b := range bids {
		if b.cl != nil {
			continue
		}
		for _, i := range tallies[k].undo {
			runs[i], tokens[i] = append(runs[i], b.run), append(tokens[i], b.token)
			some = true
		}
	}
	if !some {
		return
	}
	most := 0
	for i := range runs {
		most = max(most, len(runs[i]))
	}
	// Best effort: the lease bounds what is left, and a later try of the
	// bid takes over what an undo that lands late misses (claim.Bids). A
	// stalled minority is not waited out (quorumNodes): its undos land
	// when it resumes. Waited out, it cost every round with a bid not won
	// the whole bound, 2ms a run.
	quorumNodes(context.WithoutCancel(ctx), c, batchTimeout(c.nodeTimeout, most, 0), func(ctx context.Context, i int, n *redisnode.Node) (struct{}, error) {
		if len(runs[i]) > 0 {
			n.AbortBatch(ctx, runs[i], tokens[i])
		}
		return struct{}{}, nil
	})
}

// ClientOptions are the settings a node's client needs: the node timeout
// bounds every call (ContextTimeoutEnabled), a dead node costs one failed
// vote, not go-redis's own retries, which the validity time has no room
// for, and a new connection costs no CLIENT SETINFO round trip.
func ClientOptions(addr string) *goredis.Options {
	return &goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, DisableIdentity: true}
}

var (
	_ claim.TakeoverHolder = (*Claimer)(nil)
	_ claim.Settler        = (*Claimer)(nil)
)

// TakeoversHeld implements claim.TakeoverHolder: held when so many nodes
// hold takeovers back that a takeover's round cannot win a quorum.
func (c *Claimer) TakeoversHeld(lease time.Duration) bool {
	held := 0
	for _, n := range c.nodes {
		if n.TakeoversHeld(lease) {
			held++
		}
	}
	return held > len(c.nodes)-c.quorum
}

// Settle implements claim.Settler, on every node.
func (c *Claimer) Settle() {
	for _, n := range c.nodes {
		n.Settle()
	}
}
