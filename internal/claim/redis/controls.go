package redis

import (
	"context"
	"fmt"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Controls is the claimer's register of operator state (claim.Controls):
// pauses and run requests live beside the runs, in the same server, so
// that every replica reads them from the store it already shares. They sit
// in one hash of the namespace; the scripts and the encoding are in
// package redisnode (controls.go). Expiry is judged on the server's clock.
func (c *Claimer) Controls() claim.Controls { return controls{c} }

type controls struct{ c *Claimer }

// Put implements claim.Controls: one script call, atomic on the server.
func (k controls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	got, errs := k.PutBatch(ctx, []claim.Control{e})
	return got[0], errs[0]
}

// PutBatch implements claim.BatchPutter: each entry is decided as its Put
// would be, a hundred to a script call, all in one pipeline.
func (k controls) PutBatch(ctx context.Context, cs []claim.Control) ([]claim.Control, []error) {
	out := make([]claim.Control, len(cs))
	errs, valid := claim.CheckControls(ctx, cs)
	send := make([]claim.Control, len(valid))
	for j, i := range valid {
		send[j] = cs[i]
	}
	got, perrs := k.c.node.PutControls(ctx, send)
	for j, i := range valid {
		if perrs[j] != nil {
			errs[i] = fmt.Errorf("put control %s on %s: %w", cs[i].Key, k.c.server, perrs[j])
			continue
		}
		out[i] = got[j]
	}
	return out, errs
}

// List implements claim.Controls.
func (k controls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	return k.ListPrefixes(ctx, []string{prefix})
}

// ListPrefixes implements claim.PrefixLister: one script, one walk of the
// hash, whatever the number of prefixes.
func (k controls) ListPrefixes(ctx context.Context, prefixes []string) ([]claim.Control, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out, err := k.c.node.ListControls(ctx, prefixes...)
	if err != nil {
		return nil, fmt.Errorf("list controls %q on %s: %w", prefixes, k.c.server, err)
	}
	return out, nil
}
