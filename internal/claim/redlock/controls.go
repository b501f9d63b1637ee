package redlock

import (
	"bytes"
	"context"
	"slices"
	"strings"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// Controls is the claimer's register of operator state (claim.Controls):
// pauses and run requests live beside the runs, on the same nodes, so that
// every replica reads them from the store it already shares. Each node
// keeps them as package redis does (redisnode, controls.go); this is a
// quorum register over them. A Put runs the put script on every node and
// is acknowledged by a majority; a List reads every node, needs a
// majority, and takes for each key the entry that wins among the answers
// (see beats). Any two majorities share a node, so an acknowledged Put is
// seen by every later List (or beaten by a later write). Fewer than a
// majority answering is claim.ErrUnavailable.
func (c *Claimer) Controls() claim.Controls { return controls{c} }

type controls struct{ c *Claimer }

// Put implements claim.Controls. It returns the winner (see beats) among
// what the nodes that answered hold afterwards: c, or an entry that beats
// it on one of them.
func (k controls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	got, errs := k.PutBatch(ctx, []claim.Control{e})
	return got[0], errs[0]
}

// PutBatch implements claim.BatchPutter: one pipeline to each node, and
// each entry acknowledged by a majority of its own and answered as its Put
// would be.
func (k controls) PutBatch(ctx context.Context, cs []claim.Control) ([]claim.Control, []error) {
	out := make([]claim.Control, len(cs))
	errs, valid := claim.CheckControls(ctx, cs)
	if len(valid) == 0 {
		return out, errs
	}
	send := make([]claim.Control, len(valid))
	for j, i := range valid {
		send[j] = cs[i]
	}
	c := k.c
	got := make([][]claim.Control, len(c.nodes))
	nodeErrs := make([][]error, len(c.nodes))
	c.each(ctx, batchTimeout(c.nodeTimeout, len(send), 0), func(ctx context.Context, n int, node *redisnode.Node) {
		got[n], nodeErrs[n] = node.PutControls(ctx, send)
	})
	perNode := make([]error, len(c.nodes))
	for j, i := range valid {
		if err := ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		for n := range c.nodes {
			perNode[n] = nodeErrs[n][j]
		}
		if errs[i] = c.verdict("put control "+cs[i].Key, perNode); errs[i] != nil {
			continue
		}
		var best claim.Control
		for n := range c.nodes {
			if perNode[n] == nil && (best.Key == "" || beats(got[n][j], best)) {
				best = got[n][j]
			}
		}
		out[i] = best
	}
	return out, errs
}

// List implements claim.Controls.
func (k controls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	return k.ListPrefixes(ctx, []string{prefix})
}

// ListPrefixes implements claim.PrefixLister: one script per node, one
// walk of each node's hash, whatever the number of prefixes.
func (k controls) ListPrefixes(ctx context.Context, prefixes []string) ([]claim.Control, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := k.c
	lists := make([][]claim.Control, len(c.nodes))
	errs := make([]error, len(c.nodes))
	c.each(ctx, c.nodeTimeout, func(ctx context.Context, i int, n *redisnode.Node) {
		lists[i], errs[i] = n.ListControls(ctx, prefixes...)
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.verdict("list controls", errs); err != nil {
		return nil, err
	}
	best := map[string]claim.Control{}
	for _, l := range lists {
		for _, e := range l {
			if b, ok := best[e.Key]; !ok || beats(e, b) {
				best[e.Key] = e
			}
		}
	}
	out := make([]claim.Control, 0, len(best))
	for _, e := range best {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b claim.Control) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// beats reports whether node entry a wins over node entry b of the same
// key across nodes. Each node keeps the first First entry it was given,
// so first puts that raced may have split the nodes: among First entries
// the lowest version wins, which every reader of the same nodes picks.
// Otherwise the highest version wins, as on one node (claim.Control.Wins).
// Two writes of the same version (only distinct writers reading the same
// clock make them) are settled by the smaller value.
func beats(a, b claim.Control) bool {
	switch {
	case a.Version == b.Version:
		return bytes.Compare(a.Value, b.Value) < 0
	case a.First && b.First:
		return a.Version < b.Version
	}
	return a.Version > b.Version
}
