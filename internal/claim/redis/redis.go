package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// Options configure a Claimer.
type Options struct {
	// Instance is the holder id written into claims.
	Instance string
	// Prefix starts every key (default "scheduler:").
	Prefix string
	// DoneTTL is how long a run's hash is kept after its lease or release
	// (default 48h). It must outlive the schedule period and misfire
	// grace: once it expires, a replica that wakes late can run it again.
	DoneTTL time.Duration
	// HistoryLimit is how many runs per job History keeps (default 1000):
	// the newest ones. A job's index is trimmed back to it once it is
	// over by an eighth, so it may briefly hold that many more.
	HistoryLimit int
	// AllowEviction lets Check accept a server whose maxmemory-policy may
	// evict claims.
	AllowEviction bool
	// HashTags lays the keys out for Redis Cluster on a client that routes
	// to one but is not a *goredis.ClusterClient (which always gets that
	// layout). A single server keeps the layout it always had.
	HashTags bool
}

// Claimer is a claim.Claimer over one Redis server, or one Redis Cluster.
type Claimer struct {
	node     *redisnode.Node
	client   goredis.UniversalClient
	instance string
	server   string   // "the Redis server at <addr>", for errors
	done     *doneLog // the recent terminal releases this Claimer made or saw (restore.go)

	// claims (one per lease) and releases merge the batches of callers
	// who come at once.
	claims   claim.ClaimCoalescer
	releases claim.ReleaseCoalescer
	undos    claim.Stragglers // abortLater's
	bids     claim.Bids       // the runs whose last claim may have granted unseen

	// loss is the data loss a cluster's buckets report, one per failover
	// (see lossUntil).
	lossMu sync.Mutex
	loss   struct{ start, until time.Time }
	// report is WatchLoss's, or nil.
	report atomic.Pointer[func(*claim.DataLossError)]
}

var (
	_ claim.Claimer        = (*Claimer)(nil)
	_ claim.LossWatcher    = (*Claimer)(nil)
	_ claim.TakeoverHolder = (*Claimer)(nil)
	_ claim.Settler        = (*Claimer)(nil)
)

// WatchLoss implements claim.LossWatcher: the done watcher (restore.go)
// reports a restart guard it finds begun, which it does within a quarter
// of a lease once this Claimer has released a run, whether or not a
// claim meets the guard.
func (c *Claimer) WatchLoss(report func(*claim.DataLossError)) { c.report.Store(&report) }

// guardBegan reports the restart guard that began at since (the server's
// clock) to WatchLoss's func, for the lease the guard holds.
func (c *Claimer) guardBegan(since time.Time, lease time.Duration) {
	if p := c.report.Load(); p != nil {
		(*p)(&claim.DataLossError{Backend: c.server, Until: c.lossUntil(since, lease)})
	}
}

// New returns a Claimer over client, which it owns from now on: Close
// closes it. A *goredis.ClusterClient (or Options.HashTags) gets the
// cluster's key layout (see package redisnode). It panics on a nil client.
// Call Check before use, or use Open.
func New(client goredis.UniversalClient, opts Options) *Claimer {
	c := &Claimer{client: client, instance: opts.Instance}
	c.node = redisnode.New(client, redisnode.Options{Prefix: opts.Prefix, DoneTTL: opts.DoneTTL,
		HistoryLimit: opts.HistoryLimit, AllowEviction: opts.AllowEviction, HashTags: opts.HashTags,
		Restarted:  func() { c.done.poke() }, // a claim saw the server restart: write back now
		GrantPages: true,                     // one server decides each grant
	}, 0, 1)
	c.server = "the Redis server"
	if c.node.Cluster() {
		c.server = "the Redis Cluster"
	}
	if addr := c.node.Addr(); addr != "" {
		c.server += " at " + addr
	}
	c.done = newDoneLog(c.node, c.node.DoneTTL())
	c.done.guard = c.guardBegan
	return c
}

// Open is New followed by Check; on error it closes nothing.
func Open(ctx context.Context, client goredis.UniversalClient, opts Options) (*Claimer, error) {
	c := New(client, opts)
	if err := c.Check(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Check refuses a server that may evict claims, a cluster node behind a
// plain client (see redisnode.Node.Check), or a server that cannot be
// reached (claim.ErrUnavailable); on a cluster, every master is checked.
func (c *Claimer) Check(ctx context.Context) error { return c.node.Check(ctx) }

// granted turns a node's reply to a claim into the contract's answer.
func (c *Claimer) granted(run claim.Run, token string, requested time.Time, lease time.Duration, r redisnode.Reply) (*claim.Claim, error) {
	switch r.Vote {
	case redisnode.Held:
		if r.Restarted {
			c.done.poke() // write back this replica's done markers now
			// Until stays the same for one loss, so that it is reported
			// once; a write-back may hold runs a little longer.
			loss := &claim.DataLossError{Backend: c.server, Until: c.lossUntil(r.LostAt, lease)}
			if r.LeaseUntil.After(loss.Until) {
				return nil, fmt.Errorf("claim %s: %w (and while done markers are written back, until %s): %w",
					run.ID(), loss, r.LeaseUntil.Format(time.RFC3339Nano), claim.ErrHeld)
			}
			return nil, fmt.Errorf("claim %s: %w: %w", run.ID(), loss, claim.ErrHeld)
		}
		return nil, fmt.Errorf("claim %s: holder %s until %s: %w", run.ID(), r.Holder,
			r.LeaseUntil.Format(time.RFC3339Nano), claim.ErrHeld)
	case redisnode.Done:
		return nil, fmt.Errorf("claim %s: %s: %w", run.ID(), r.Status, claim.ErrDone)
	}
	return &claim.Claim{
		Run: run, Token: token, Holder: c.instance, Fence: r.Fence, Attempt: r.Attempt,
		Deadline: r.LeaseUntil, Requested: requested, Lease: lease, Page: r.Page,
	}, nil
}

// lossUntil is the end of the restart guard that began at lostAt, as the
// error reports it. On a single server that is lostAt + lease. On a
// cluster each bucket's guard begins at its own first script after the
// failover, so one failover would read as many losses, each a little
// later; guards that began within a lease of the first are reported as
// that one loss, held until its start plus two leases (when the last of
// them has ended, at the latest).
func (c *Claimer) lossUntil(lostAt time.Time, lease time.Duration) time.Time {
	if !c.node.Cluster() {
		return lostAt.Add(lease)
	}
	c.lossMu.Lock()
	defer c.lossMu.Unlock()
	l := &c.loss
	switch {
	case !l.start.IsZero() && lostAt.Sub(l.start).Abs() < lease:
	case l.start.IsZero() || lostAt.After(l.start):
		l.start, l.until = lostAt, lostAt.Add(2*lease)
	default: // an older loss, reported late
		return lostAt.Add(lease)
	}
	return l.until
}

// Claim implements claim.Claimer: the runs go in batches of one script
// call each (redisnode.Node.ClaimBatch), pipelined in one round trip.
// Claims made from several goroutines at once, under the same lease, are
// merged into such batches (claim.ClaimCoalescer).
func (c *Claimer) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	return c.claims.Claim(ctx, runs, lease, func(ctx context.Context, runs []claim.Run) []claim.Answer {
		return c.claim(ctx, runs, lease)
	}, func(ctx context.Context, granted []*claim.Claim) {
		// Granted to callers who left: undone, and if the undo is lost,
		// the next claim of a run takes the grant (abortLater).
		runs, tokens := claim.RunsAndTokens(granted)
		c.bids.OpenAll(runs, tokens, time.Now().Add(lease))
		c.abort(ctx, runs, tokens)
	})
}

// claim sends one batch of valid runs.
func (c *Claimer) claim(ctx context.Context, runs []claim.Run, lease time.Duration) []claim.Answer {
	out := make([]claim.Answer, len(runs))
	tokens := make([]string, len(runs))
	for k, run := range runs {
		tokens[k] = c.bids.Token(run)
	}
	c.done.lease.Store(int64(lease))
	if err := c.done.refusal(); err != nil {
		for k, run := range runs {
			out[k].Err = fmt.Errorf("claim %s: %w: %w", run.ID(), claim.ErrUnavailable, err)
		}
		return out
	}
	requested := time.Now()
	replies, rerrs := c.node.ClaimBatch(ctx, runs, tokens, c.instance, lease)
	if err := ctx.Err(); err != nil {
		// Scripts may have granted before the callers gave up: undo them
		// rather than leave ghosts holding the runs for a whole lease.
		c.abortLater(ctx, runs, tokens, lease)
		for k, run := range runs {
			out[k].Err = fmt.Errorf("claim %s: %w", run.ID(), err)
		}
		return out
	}
	var done []redisnode.Finished
	var failed []int
	for k, run := range runs {
		if rerrs[k] != nil {
			// Undo whatever the script did: the server answered with an
			// error part way, or the reply was lost (a timeout, a dropped
			// connection) after the script granted. Left alone, such a
			// grant would hold the run for a whole lease with nobody to
			// run it. A server that never got the call undoes nothing.
			out[k].Err = fmt.Errorf("claim %s: %w", run.ID(), rerrs[k])
			failed = append(failed, k)
			continue
		}
		if r := replies[k]; r.Vote == redisnode.Done {
			done = append(done, redisnode.Finished{Run: run, Holder: r.Holder, Fence: r.Fence,
				Attempt: r.Attempt, Status: r.Status, At: requested})
		}
		out[k].Claim, out[k].Err = c.granted(run, tokens[k], requested, lease, replies[k])
	}
	c.done.add(done) // remembered for a write-back after a data loss (restore.go), the batch under one lock
	if len(failed) > 0 {
		fruns, ftokens := make([]claim.Run, len(failed)), make([]string, len(failed))
		for j, k := range failed {
			fruns[j], ftokens[j] = runs[k], tokens[k]
		}
		c.abortLater(ctx, fruns, ftokens, lease)
	}
	return out
}

// abortLater is abort on a goroutine of its own, which Close waits for:
// the callers of a batch that failed hear of it at once, not up to a
// second later from a server that does not answer. The bids stay open for
// a lease: if the undo is lost too (a stalled server), this replica's next
// claim of a run is granted the grant its lost try left (claim.Bids), not
// held off by it for a lease.
func (c *Claimer) abortLater(ctx context.Context, runs []claim.Run, tokens []string, lease time.Duration) {
	c.bids.OpenAll(runs, tokens, time.Now().Add(lease))
	c.undos.Go(func() { c.abort(ctx, runs, tokens) })
}

// abort undoes grants nobody will use, best effort, within a second
// even once ctx is done.
func (c *Claimer) abort(ctx context.Context, runs []claim.Run, tokens []string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	c.node.AbortBatch(actx, runs, tokens)
}

// Renew implements claim.Claimer.
func (c *Claimer) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	if err := claim.CheckRenew(cl, lease); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	requested := time.Now()
	until, err := c.node.Renew(ctx, cl, lease, false)
	if err != nil {
		return fmt.Errorf("renew %s: %w", cl.ID(), err)
	}
	cl.Deadline, cl.Requested, cl.Lease = until, requested, lease
	return nil
}

// Release implements claim.Claimer: the claims go in batches of one
// script call each (redisnode.Node.ReleaseBatch), pipelined in one round
// trip. Releases made from several goroutines at once are merged into such
// batches (claim.ReleaseCoalescer).
func (c *Claimer) Release(ctx context.Context, cls []*claim.Claim, outcomes []claim.Status) []error {
	return c.releases.Release(ctx, cls, outcomes, c.release)
}

// release sends one batch of valid releases.
func (c *Claimer) release(ctx context.Context, ends []claim.Ending) []error {
	ids, tokens, outs := make([]string, len(ends)), make([]string, len(ends)), make([]claim.Status, len(ends))
	sent := make([]*claim.Claim, len(ends))
	for k, e := range ends {
		ids[k], tokens[k], outs[k], sent[k] = e.Claim.ID(), e.Claim.Token, e.Outcome, e.Claim
	}
	errs := c.node.ReleaseBatch(ctx, ids, tokens, outs)
	for k, err := range errs {
		// A run that finished while the server lost its record: write
		// its end down, as the watcher writes back remembered ones. Left
		// refused, it was run again after the restart guard, as attempt 1,
		// or recorded missed though it ran (an outside review: FLUSHALL).
		if errors.Is(err, redisnode.ErrGone) && outs[k].Terminal() {
			cl := sent[k]
			f := redisnode.Finished{Run: cl.Run, Token: cl.Token, Holder: cl.Holder, Fence: cl.Fence,
				Attempt: cl.Attempt, Status: outs[k], At: time.Now()}
			switch ok, rerr := c.node.RecordGone(ctx, f, c.node.DoneTTL(), time.Duration(c.done.lease.Load())); {
			case errors.Is(rerr, claim.ErrUnavailable):
				// The server refused the write (a node made a replica of
				// an empty one: READONLY, its data wiped): unanswered, not
				// lost, so the runner retries until it lands. As "lease
				// lost" too, the release was given up, and the run ran
				// again or was recorded missed though it ran (an outside
				// review).
				errs[k] = fmt.Errorf("%v; writing its end down: %w", err, rerr)
			case rerr != nil:
				errs[k] = fmt.Errorf("%w; writing its end down: %w", err, rerr)
			case ok:
				errs[k] = nil
			}
		}
	}
	c.done.released(sent, outs, errs)
	for k, err := range errs {
		if err != nil {
			errs[k] = fmt.Errorf("release %s as %s: %w", ids[k], outs[k], err)
		}
	}
	return errs
}

// Ping implements claim.Claimer.
func (c *Claimer) Ping(ctx context.Context) error {
	if err := c.node.Ping(ctx); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

// Close implements claim.Claimer: it closes the client given to New.
func (c *Claimer) Close() error {
	// What batches in flight and failed claims still undo reaches the
	// server first: a grant undone after the client closed would hold its
	// run, for nobody, for a whole lease.
	c.claims.Wait()
	c.releases.Wait()
	c.undos.Wait()
	c.done.close()
	return c.client.Close()
}

// History implements claim.Claimer.
func (c *Claimer) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	recs, err := c.node.History(ctx, job, limit)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return recs, nil
}

var _ claim.Historian = (*Claimer)(nil)

// Histories implements claim.Historian: two pipelines for every query
// (redisnode.Node.Histories).
func (c *Claimer) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	hists, err := c.node.Histories(ctx, qs)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return hists, nil
}

// TakeoversHeld implements claim.TakeoverHolder.
func (c *Claimer) TakeoversHeld(lease time.Duration) bool { return c.node.TakeoversHeld(lease) }

// Settle implements claim.Settler.
func (c *Claimer) Settle() { c.node.Settle() }
