// Package redis is a claim.Claimer over one Redis server (go-redis/v9).
//
// # Layout
//
// Keys start with Options.Prefix (default "scheduler:"):
//
//	run:<run id>   hash: token, holder, fence, attempt, status, started_at,
//	               lease_until, finished_at (ms on the Redis server's clock),
//	               server (the run_id of the server incarnation that granted)
//	fence:<job>    the job's last fence
//	runs:<job>     sorted set of run ids scored by scheduled instant (ms),
//	               trimmed to HistoryLimit
//	jobs           set of job names
//	server         the marker: hash of run_id (the server incarnation the
//	               namespace last saw) and since (when the restart guard
//	               began, ms; 0 for none)
//
// # Claims
//
// Claim is one Lua script, one round trip. With no run hash it grants
// attempt 1: the SET NX of the classic Redis lock, done in Lua so that the
// fence and the attempt are written in the same atomic step. A running hash
// whose lease_until is still ahead of the server's TIME is held; one in a
// terminal status (succeeded, failed, skipped) is done; an interrupted or expired one is taken
// over with attempt+1. Leases live in lease_until, measured on the server
// clock only, not in the key's TTL: the key lives DoneTTL past the lease (set
// at every grant and renewal, reset to DoneTTL at release), so the attempt
// count survives an expired lease and a finished run's "done" marker
// outlives the schedule period and misfire grace. Renew and Release are
// compare-token-then-act scripts.
//
// # Fences
//
// A new fence is max(stored+1, server TIME in µs). The stored+1 term makes
// fences strictly grow on one server; the clock term keeps them growing when
// the server restarts with no data (the usual no-persistence setup), as long
// as the server's clock does not step back past the fences already issued
// and no more than one grant per µs was made on average. A restored older
// snapshot is survived the same way. A clock stepped back (or a restore on
// a host whose clock is behind) can issue a fence already seen.
//
// # Restarts
//
// A server restarts empty (no persistence), or with some of its keys (an
// RDB snapshot, an AOF with appendfsync everysec after a crash of the
// host, a replica promoted after a failover): either way live claims,
// renewals and done markers written after the last save are gone, and a
// run still executing on a replica could be granted again at once.
// Whether that happened is not left to what a replica remembers: Redis
// draws a new run_id at every start, and every claim script reads it (INFO
// server) and compares it with the one in the namespace's marker. A
// different run_id, or a missing marker, means the data may be partial,
// and the script starts the restart guard: it rewrites the marker with the
// new run_id and the server's time and answers held for every run until a
// lease has passed from then; that ErrHeld carries a claim.DataLossError,
// so the runner warns and counts it. A run hash records the run_id that
// granted it, and a renewal of a claim granted before the restart is
// refused (ErrLeaseLost), restored from disk or not; a holder whose
// renewal is refused, or who cannot reach the server, stops trusting its
// claim within a lease of its last renewal, which was before the guard
// began. So no run executes on two replicas at once. A run restored as
// running is taken over after the guard with attempt+1.
//
// A missing marker is also what a new namespace looks like, and nothing
// tells the two apart, so a new deployment waits out the guard too, once,
// unless its server has been up for longer than a lease: by then every
// claim of an earlier incarnation has expired for its holder, and a
// missing marker needs no guard (unless the caller saw the marker on this
// same incarnation: then the keys were deleted, and the guard starts).
// MarkNew declares a namespace new where one is created on purpose (tests).
// The guard lasts the caller's lease: every replica must use the same one.
//
// The done markers of finished runs went too, or came back as running.
// Each Claimer remembers its own terminal releases of the last DoneTTL (at
// most 50,000) and, once it has made one, reads the marker every lease/4
// (at once when a claim sees the run_id change); when it changes it writes
// those done markers back over whatever the restart left of each run,
// nothing or a live record from before the restart, but never over a grant
// made since. It writes 500 runs to a script call, and each call made
// while the guard holds extends the guard to a lease from then
// (restore.go): the guard ends a lease after the last write-back, however
// long a loaded server takes, never before. A run that finished before
// the restart therefore stays done while the replica that finished it is
// up. DataLossError.Until is the guard's first end, so that the runner
// reports one loss once.
//
// What remains exposed: a run that finished just before the restart on a
// replica that is gone too (nobody remembers it, so a replica that stood by
// for it runs it again after the guard); a release that never reached the
// server (the run finished while it was down: the release is refused
// afterwards, and the run is executed again after the guard); keys deleted
// under a long-running server (FLUSHDB) seen first by a replica that never
// claimed there; and a write-back by a replica that notices the restart
// only after the guard ended (it was cut off from the server for a lease).
// Run Redis with persistence (appendonly) where that matters,
// or use redlock.
//
// # Limits
//
// A server that may evict keys (maxmemory with a policy other than
// noeviction) can drop a live claim and run a job twice: Open and Check
// refuse it unless Options.AllowEviction. Replication is asynchronous, so a
// failover to a replica can lose the latest grants; use redlock when that
// matters. Redis Cluster is not supported: a claim updates several keys of
// one job atomically and they are not in one hash slot.
//
// Clients should set ContextTimeoutEnabled so that a caller's deadline
// bounds each call; without it go-redis waits up to its ReadTimeout.
package redis

import (
	"cmp"
	"context"
	"fmt"
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
	// HistoryLimit is how many runs per job History keeps (default 1000).
	HistoryLimit int
	// AllowEviction lets Check accept a server whose maxmemory-policy may
	// evict claims.
	AllowEviction bool
}

func (o Options) withDefaults() Options {
	o.Prefix = cmp.Or(o.Prefix, DefaultPrefix)
	o.DoneTTL = cmp.Or(o.DoneTTL, DefaultDoneTTL)
	o.HistoryLimit = cmp.Or(o.HistoryLimit, DefaultHistoryLimit)
	return o
}

// Claimer is a claim.Claimer and claim.Historian over one Redis server.
type Claimer struct {
	node     *Node
	client   goredis.UniversalClient
	instance string
	server   string   // "the Redis server at <addr>", for errors
	done     *doneLog // this Claimer's recent terminal releases (restore.go)
}

var (
	_ claim.Claimer       = (*Claimer)(nil)
	_ claim.Historian     = (*Claimer)(nil)
	_ claim.BatchClaimer  = (*Claimer)(nil)
	_ claim.BatchReleaser = (*Claimer)(nil)
)

// New returns a Claimer over client, which it owns from now on: Close
// closes it. It panics on a nil client. Call Check before use, or use Open.
func New(client goredis.UniversalClient, opts Options) *Claimer {
	n := NewNode(client, opts, 0, 1)
	server := "the Redis server"
	if n.Addr() != "" {
		server += " at " + n.Addr()
	}
	c := &Claimer{node: n, client: client, instance: opts.Instance, server: server,
		done: newDoneLog(n, opts.withDefaults().DoneTTL)}
	n.changed = c.done.poke // a claim saw the server restart: write back now
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

// Check refuses a server that may evict claims (see Node.Check) or that
// cannot be reached (claim.ErrUnavailable).
func (c *Claimer) Check(ctx context.Context) error { return c.node.Check(ctx) }

// Claim implements claim.Claimer.
func (c *Claimer) Claim(ctx context.Context, run claim.Run, lease time.Duration) (*claim.Claim, error) {
	if err := claim.CheckClaim(run, lease); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	run.At = run.At.UTC()
	c.done.lease.Store(int64(lease))
	token := claim.NewToken()
	requested := time.Now()
	r, err := c.node.Claim(ctx, run, token, c.instance, lease)
	if err != nil {
		if ctx.Err() != nil {
			// The script may have granted before the caller gave up: undo it
			// rather than leave a ghost holding the run for a whole lease.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = c.node.Abort(actx, run, token)
			cancel()
		}
		return nil, fmt.Errorf("claim %s: %w", run.ID(), err)
	}
	return c.granted(run, token, requested, lease, r)
}

// granted turns a node's reply to a claim into the contract's answer.
func (c *Claimer) granted(run claim.Run, token string, requested time.Time, lease time.Duration, r Reply) (*claim.Claim, error) {
	switch r.Vote {
	case Held:
		if r.Restarted {
			c.done.poke() // write back this replica's done markers now
			// Until stays the same for one loss, so that it is reported
			// once; a write-back may hold runs a little longer.
			loss := &claim.DataLossError{Backend: c.server, Until: r.LostAt.Add(lease)}
			if r.LeaseUntil.After(loss.Until) {
				return nil, fmt.Errorf("claim %s: %w (and while done markers are written back, until %s): %w",
					run.ID(), loss, r.LeaseUntil.Format(time.RFC3339Nano), claim.ErrHeld)
			}
			return nil, fmt.Errorf("claim %s: %w: %w", run.ID(), loss, claim.ErrHeld)
		}
		return nil, fmt.Errorf("claim %s: holder %s until %s: %w", run.ID(), r.Holder,
			r.LeaseUntil.Format(time.RFC3339Nano), claim.ErrHeld)
	case Done:
		return nil, fmt.Errorf("claim %s: %s: %w", run.ID(), r.Status, claim.ErrDone)
	}
	return &claim.Claim{
		Run: run, Token: token, Holder: c.instance, Fence: r.Fence, Attempt: r.Attempt,
		Deadline: r.LeaseUntil, Requested: requested, Lease: lease,
	}, nil
}

// ClaimBatch implements claim.BatchClaimer: the claim script of every run,
// pipelined in one round trip.
func (c *Claimer) ClaimBatch(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	claims := make([]*claim.Claim, len(runs))
	errs, idx := claim.CheckClaimBatch(ctx, runs, lease)
	valid, tokens := make([]claim.Run, len(idx)), make([]string, len(idx))
	for k, i := range idx {
		valid[k], tokens[k] = runs[i], claim.NewToken()
		valid[k].At = valid[k].At.UTC()
	}
	if len(valid) == 0 {
		return claims, errs
	}
	c.done.lease.Store(int64(lease))
	requested := time.Now()
	replies, rerrs := c.node.ClaimBatch(ctx, valid, tokens, c.instance, lease)
	if err := ctx.Err(); err != nil {
		// Scripts may have granted before the caller gave up: undo them
		// rather than leave ghosts holding the runs for a whole lease.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		c.node.AbortBatch(actx, valid, tokens)
		cancel()
		for _, i := range idx {
			errs[i] = fmt.Errorf("claim %s: %w", runs[i].ID(), err)
		}
		return claims, errs
	}
	for k, i := range idx {
		if rerrs[k] != nil {
			errs[i] = fmt.Errorf("claim %s: %w", valid[k].ID(), rerrs[k])
			continue
		}
		claims[i], errs[i] = c.granted(valid[k], tokens[k], requested, lease, replies[k])
	}
	return claims, errs
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

// Release implements claim.Claimer.
func (c *Claimer) Release(ctx context.Context, cl *claim.Claim, o claim.Outcome) error {
	if err := claim.CheckRelease(cl, o); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.node.Release(ctx, cl.ID(), cl.Token, o); err != nil {
		return fmt.Errorf("release %s as %s: %w", cl.ID(), o, err)
	}
	c.done.released([]*claim.Claim{cl}, []claim.Outcome{o}, []error{nil})
	return nil
}

// ReleaseBatch implements claim.BatchReleaser: the release script of every
// claim, pipelined in one round trip.
func (c *Claimer) ReleaseBatch(ctx context.Context, cls []*claim.Claim, outcomes []claim.Outcome) []error {
	errs, idx := claim.CheckReleaseBatch(cls, outcomes)
	ids, tokens, outs := make([]string, len(idx)), make([]string, len(idx)), make([]claim.Outcome, len(idx))
	for k, i := range idx {
		ids[k], tokens[k], outs[k] = cls[i].ID(), cls[i].Token, outcomes[i]
	}
	if len(idx) == 0 {
		return errs
	}
	sent := make([]*claim.Claim, len(idx))
	rerrs := c.node.ReleaseBatch(ctx, ids, tokens, outs)
	for k, err := range rerrs {
		sent[k] = cls[idx[k]]
		if err != nil {
			errs[idx[k]] = fmt.Errorf("release %s as %s: %w", ids[k], outs[k], err)
		}
	}
	c.done.released(sent, outs, rerrs)
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
	c.done.close()
	return c.client.Close()
}

// History implements claim.Historian.
func (c *Claimer) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	recs, err := c.node.History(ctx, job, limit)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return recs, nil
}
