package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// The operator's state (claim.Controls) lives under ctl/, one key per
// entry holding the claim.Control as JSON. Put is a compare-and-swap on
// the key's revision: create it if absent, replace it if what was read
// loses (claim.Control.Wins) or has expired, else return what was read.
// An entry that expires is written under a lease that ends a second after
// it, so etcd forgets it; until then readers judge its expiry on their
// own clock.

// maxPutRounds bounds the compare-and-swap rounds of one Put; each lost
// round means another writer changed the key in between.
const maxPutRounds = 16

// Controls returns the register of operator state on c's cluster, usable
// until c is closed.
func (c *Claimer) Controls() claim.Controls { return controls{c} }

type controls struct{ c *Claimer }

var _ claim.Controls = controls{}

// Put implements claim.Controls.
func (s controls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	if err := claim.CheckControl(ctx, e); err != nil {
		return claim.Control{}, err
	}
	c := s.c
	key := c.keys.control(e.Key)
	if !e.Expires.IsZero() {
		e.Expires = e.Expires.UTC()
	}
	val, err := json.Marshal(e)
	if err != nil {
		return claim.Control{}, fmt.Errorf("put control %q: %w", e.Key, err)
	}
	var opts []clientv3.OpOption
	if !e.Expires.IsZero() {
		g, err := c.cli.Grant(ctx, leaseSeconds(time.Until(e.Expires)+time.Second))
		if err != nil {
			return claim.Control{}, fmt.Errorf("put control %q: %w", e.Key, c.translate(ctx, err))
		}
		opts = append(opts, clientv3.WithLease(g.ID))
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	for range maxPutRounds {
		resp, err := c.cli.Txn(ctx).If(cmp).
			Then(clientv3.OpPut(key, string(val), opts...)).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return claim.Control{}, fmt.Errorf("put control %q: %w", e.Key, c.translate(ctx, err))
		}
		if resp.Succeeded {
			return e, nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 { // deleted meanwhile (its lease ended)
			cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
			continue
		}
		stored, err := decodeControl(kvs[0].Value)
		if err != nil {
			return claim.Control{}, fmt.Errorf("put control %q: %w", e.Key, err)
		}
		if !stored.Expired(time.Now()) && !e.Wins(stored) {
			return stored, nil
		}
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)
	}
	return claim.Control{}, fmt.Errorf("put control %q: %w: the key changed in each of %d rounds", e.Key, claim.ErrUnavailable, maxPutRounds)
}

// List implements claim.Controls: etcd returns keys in byte order.
func (s controls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	c := s.c
	resp, err := c.cli.Get(ctx, c.keys.control(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list controls %q: %w", prefix, c.translate(ctx, err))
	}
	now := time.Now()
	var out []claim.Control
	for _, kv := range resp.Kvs {
		e, err := decodeControl(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("list controls %q: %s: %w", prefix, strings.TrimPrefix(string(kv.Key), c.keys.control("")), err)
		}
		if !e.Expired(now) {
			out = append(out, e)
		}
	}
	return out, nil
}

func decodeControl(b []byte) (claim.Control, error) {
	var e claim.Control
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("etcd: control: %w", err)
	}
	return e, nil
}
