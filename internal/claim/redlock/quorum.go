package redlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// tally counts per-node results: nil is a yes, ErrLeaseLost a no, and
// anything else a node that could not answer.
type tally struct{ yes, no, unreachable int }

func count(errs []error) tally {
	var t tally
	for _, err := range errs {
		switch {
		case err == nil:
			t.yes++
		case errors.Is(err, claim.ErrLeaseLost):
			t.no++
		default:
			t.unreachable++
		}
	}
	return t
}

// verdict turns a tally into the contract's answer: a majority of yes is
// success; a majority out of reach because nodes said no is ErrLeaseLost;
// a majority out of reach only because nodes did not answer is
// ErrUnavailable.
func (c *Claimer) verdict(action string, errs []error) error {
	t := count(errs)
	switch {
	case t.yes >= c.quorum:
		return nil
	case t.yes+t.unreachable >= c.quorum:
		return fmt.Errorf("%s: done on %d of %d nodes, %d did not answer: %w (%s)",
			action, t.yes, len(c.nodes), t.unreachable, claim.ErrUnavailable, reasons(errs))
	}
	return fmt.Errorf("%s: done on %d of %d nodes, %d refused: %w (%s)",
		action, t.yes, len(c.nodes), t.no, claim.ErrLeaseLost, reasons(errs))
}

// reasons summarises per-node errors, each distinct text once with its
// count, as text: the nodes' errors are not the caller's to match.
func reasons(errs []error) string {
	var texts []string
	n := map[string]int{}
	for _, err := range errs {
		if err == nil {
			continue
		}
		if n[err.Error()]++; n[err.Error()] == 1 {
			texts = append(texts, err.Error())
		}
	}
	for i, t := range texts {
		texts[i] = fmt.Sprintf("%d× %s", n[t], t)
	}
	return strings.Join(texts, "; ")
}

// Renew implements claim.Claimer.
func (c *Claimer) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	if err := claim.CheckRenew(cl, lease); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	until := make([]time.Time, len(c.nodes))
	errs := make([]error, len(c.nodes))
	c.each(ctx, c.timeout(lease), func(ctx context.Context, i int, n *redisnode.Node) {
		// A node that lost the claim is given it back (repair): see the
		// design notes in doc.go.
		until[i], errs[i] = n.Renew(ctx, cl, lease, true)
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.verdict("renew "+cl.ID(), errs); err != nil {
		return err
	}
	if v := validity(start, lease); v <= 0 {
		return fmt.Errorf("renew %s: no validity left after %v of a %v lease: %w",
			cl.ID(), time.Since(start).Round(time.Millisecond), lease, claim.ErrUnavailable)
	}
	var deadline time.Time
	for i, err := range errs {
		if err == nil && (deadline.IsZero() || until[i].Before(deadline)) {
			deadline = until[i]
		}
	}
	cl.Deadline, cl.Requested, cl.Lease = deadline, start, lease
	return nil
}

// Release implements claim.Claimer: the release script for every claim,
// pipelined to each node in one round; each claim is released when a
// majority released it. Releases made from several goroutines at once are
// merged into such rounds (claim.ReleaseCoalescer).
func (c *Claimer) Release(ctx context.Context, cls []*claim.Claim, outcomes []claim.Status) []error {
	return c.releases.Release(ctx, cls, outcomes, c.release)
}

// release sends one round of valid releases.
func (c *Claimer) release(ctx context.Context, ends []claim.Ending) []error {
	ids, tokens, outs := make([]string, len(ends)), make([]string, len(ends)), make([]claim.Status, len(ends))
	for k, e := range ends {
		ids[k], tokens[k], outs[k] = e.Claim.ID(), e.Claim.Token, e.Outcome
	}
	// A stalled minority is not waited out (quorumNodes); its releases
	// land when it resumes.
	nodeErrs, cut := quorumNodes(ctx, c, batchTimeout(c.nodeTimeout, len(ids), 0), func(ctx context.Context, _ int, n *redisnode.Node) ([]error, error) {
		errs := n.ReleaseBatch(ctx, ids, tokens, outs)
		return errs, firstIfAll(errs)
	})
	for i, errs := range nodeErrs { // by node, then claim
		if errs == nil { // cut short
			nodeErrs[i] = make([]error, len(ids))
			for k := range ids {
				nodeErrs[i][k] = cut[i]
			}
		}
	}
	errs := make([]error, len(ends))
	for k := range ends {
		if err := ctx.Err(); err != nil {
			errs[k] = err
			continue
		}
		errs[k] = c.verdict(fmt.Sprintf("release %s as %s", ids[k], outs[k]), column(nodeErrs, k))
	}
	return errs
}

// Ping implements claim.Claimer: a majority must answer, each within a
// second at least. The node timeout (50ms by default) bounds a claim's
// answers so that the lease keeps its validity; a probe of readiness has
// no validity to keep, and on a connection not yet open (a dial, the
// handshake, then the write) or a loaded machine it is too short: the
// replica would read as not ready for want of a warm connection.
func (c *Claimer) Ping(ctx context.Context) error {
	errs := make([]error, len(c.nodes))
	c.each(ctx, max(c.nodeTimeout, time.Second), func(ctx context.Context, i int, n *redisnode.Node) {
		errs[i] = n.Ping(ctx)
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.verdict("ping", errs); err != nil {
		return err
	}
	// A node set to evict since Open checked it (CONFIG SET, a restart
	// with another config) is refused as Check refuses it, even alone: a
	// majority cannot grant a run by itself, but one more node lost or
	// evicting could (an outside review found it unreported).
	var evicting []error
	for i, err := range errs {
		if errors.Is(err, redisnode.ErrMayEvict) {
			evicting = append(evicting, fmt.Errorf("node %d: %w", i, err))
		}
	}
	return errors.Join(evicting...)
}

// Check runs redisnode.Node.Check on every node: a node that may evict keys is
// refused even if it is the only one; so are two addresses of one server
// (the same run_id), whose one vote would count twice toward a quorum;
// a majority must answer.
func (c *Claimer) Check(ctx context.Context) error {
	errs := make([]error, len(c.nodes))
	ids := make([]string, len(c.nodes))
	c.each(ctx, max(c.nodeTimeout, time.Second), func(nctx context.Context, i int, n *redisnode.Node) {
		id, err := n.CheckID(nctx)
		if err != nil && ctx.Err() == nil && nctx.Err() != nil {
			// The node's own timeout, not the caller's: it did not
			// answer in time.
			err = fmt.Errorf("%w: %w", claim.ErrUnavailable, err)
		}
		if err != nil {
			errs[i] = fmt.Errorf("node %d: %w", i, err)
		}
		ids[i] = id
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	var refused []error
	for _, err := range errs {
		if err != nil && !errors.Is(err, claim.ErrUnavailable) {
			refused = append(refused, err)
		}
	}
	first := map[string]int{}
	for i, id := range ids {
		if id == "" {
			continue
		}
		if j, ok := first[id]; ok {
			refused = append(refused, fmt.Errorf("nodes %d (%s) and %d (%s) are one server (run_id %s): "+
				"one node counted twice fakes a quorum; list each server once", j, c.nodes[j].Addr(), i, c.nodes[i].Addr(), id))
			continue
		}
		first[id] = i
	}
	if len(refused) > 0 {
		return errors.Join(refused...)
	}
	return c.verdict("check", errs)
}

// Close implements claim.Claimer: it closes every node's client.
func (c *Claimer) Close() error {
	// What batches in flight still undo reaches the nodes first.
	c.claims.Wait()
	c.releases.Wait()
	var errs []error
	for _, cl := range c.clients {
		errs = append(errs, cl.Close())
	}
	return errors.Join(errs...)
}

// History implements claim.Claimer. It merges what a majority of nodes
// remember. For each run it keeps the grant a majority of the answers
// hold (by fence; of its copies, the most advanced). A bid that failed on
// a minority of nodes leaves a higher attempt there, or an aborted,
// interrupted record with a later lease; reporting it as the run's state
// would misdate or hide the live grant, which the runner's overlap probe
// orders runs by. Where no grant has a majority of the answers (the
// holder's majority includes nodes that did not answer), a run with a
// running copy is reported running, as early as its earliest running
// copy started, until its latest running lease, with the lowest running
// fence: the probe must not miss or misdate a run that may be live, and
// a copy that was not live costs a later run at most a lease of waiting.
// Otherwise the most advanced record of any node stands (highest attempt,
// then a terminal one, then the latest lease).
func (c *Claimer) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	lists, errs := readNodes(ctx, c, max(10*c.nodeTimeout, time.Second), func(ctx context.Context, n *redisnode.Node) ([]claim.Record, error) {
		return n.History(ctx, job, limit)
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.verdict("history", errs); err != nil {
		return nil, err
	}
	return c.merge(lists, limit), nil
}

var _ claim.Historian = (*Claimer)(nil)

// Histories implements claim.Historian: every node answers every query
// in its two pipelines (redisnode.Node.Histories), and each query's
// answers are merged as History merges them.
func (c *Claimer) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	answers, errs := readNodes(ctx, c, max(10*c.nodeTimeout, time.Second), func(ctx context.Context, n *redisnode.Node) ([][]claim.Record, error) {
		return n.Histories(ctx, qs)
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.verdict("history", errs); err != nil {
		return nil, err
	}
	hists := make([][]claim.Record, len(qs))
	lists := make([][]claim.Record, len(c.nodes))
	for q := range qs {
		for i := range lists {
			lists[i] = nil
			if errs[i] == nil {
				lists[i] = answers[i][q]
			}
		}
		hists[q] = c.merge(lists, qs[q].Limit)
	}
	return hists, nil
}

// merge is the runs the nodes' lists (nil for a node that did not
// answer) say, by the rules History's comment gives, newest first, at
// most limit (<= 0: all).
func (c *Claimer) merge(lists [][]claim.Record, limit int) []claim.Record {
	type grant struct {
		run   string
		fence int64
	}
	copies := map[grant]int{}
	quorum := map[grant]claim.Record{} // the most advanced copy of each grant
	best := map[string]claim.Record{}
	// A node that missed a grant is given it back at a renewal (repair),
	// stamped with that renewal's time: the grant started at its earliest
	// copy. The overlap probe orders runs by it, and a start that moved
	// later would let a later run start beside this one.
	started := map[grant]time.Time{}
	for _, l := range lists {
		for _, r := range l {
			g := grant{r.RunID, r.Fence}
			if s, ok := started[g]; !ok || r.StartedAt.Before(s) {
				started[g] = r.StartedAt
			}
		}
	}
	live := map[string]claim.Record{} // per run, what its running copies say at the widest
	for _, l := range lists {
		for _, r := range l {
			g := grant{r.RunID, r.Fence}
			r.StartedAt = started[g]
			copies[g]++
			if q, ok := quorum[g]; !ok || ahead(r, q) {
				quorum[g] = r
			}
			if b, ok := best[r.RunID]; !ok || ahead(r, b) {
				best[r.RunID] = r
			}
			if r.Status == claim.Running {
				live[r.RunID] = widen(live[r.RunID], r)
			}
		}
	}
	decided := map[string]bool{}
	for g, n := range copies {
		if n >= len(c.nodes)/2+1 {
			best[g.run], decided[g.run] = quorum[g], true
		}
	}
	for run, r := range live {
		if !decided[run] && best[run].Status.Live() {
			best[run] = r
		}
	}
	out := make([]claim.Record, 0, len(best))
	for _, r := range best {
		out = append(out, r)
	}
	redisnode.SortRecords(out)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// widen merges running copy r into w (zero: none yet): the earliest
// start, the latest lease, the lowest fence; the other fields are those of
// the copy with the latest lease.
func widen(w, r claim.Record) claim.Record {
	if w.RunID == "" {
		return r
	}
	start, fence := w.StartedAt, w.Fence
	if r.LeaseUntil.After(w.LeaseUntil) {
		w = r
	}
	w.StartedAt, w.Fence = minTime(start, r.StartedAt), min(fence, r.Fence)
	return w
}

// ahead reports whether node record a is further along than b.
func ahead(a, b claim.Record) bool {
	switch {
	case a.Attempt != b.Attempt:
		return a.Attempt > b.Attempt
	case a.Status.Live() != b.Status.Live():
		return !a.Status.Live()
	}
	return a.LeaseUntil.After(b.LeaseUntil)
}
