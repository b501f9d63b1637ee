package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Release implements claim.Claimer: per chunk of claims one transaction
// of nested ones, one per claim: if the live key still holds the claim's
// token, write the record with the outcome (under the done lease if it is
// terminal) and delete the live key; else read the record. The record
// tells a retry of a release that took effect (same token, same outcome:
// success) from a claim taken over (another token: ErrLeaseLost). A claim
// whose lease ran out with nobody taking the run over (the record still
// holds its token, as running) is released in a second round, comparing
// the record's revision, as the SQL backends allow.
func (c *Claimer) Release(ctx context.Context, cls []*claim.Claim, outcomes []claim.Status) []error {
	errs, pending := claim.CheckReleaseBatch(cls, outcomes)
	if len(pending) == 0 {
		return errs
	}
	defer func() {
		// A claim released, or found lost, is renewed no more; one whose
		// release failed may be, until a retry lands.
		for _, i := range pending {
			if errs[i] == nil || errors.Is(errs[i], claim.ErrLeaseLost) {
				c.revs.drop(cls[i].Token)
			}
		}
	}()
	fail := func(idx []int, err error) {
		for _, i := range idx {
			errs[i] = fmt.Errorf("release %s as %s: %w", cls[i].ID(), outcomes[i], err)
		}
	}
	if err := ctx.Err(); err != nil {
		fail(pending, err)
		return errs
	}
	finished := time.Now().UTC()
	put := func(i int, done clientv3.LeaseID) clientv3.Op {
		o := outcomes[i]
		// A released claim's lease ended when it was released.
		r := recordOf(cls[i], o, finished)
		if !o.Terminal() {
			return clientv3.OpPut(c.keys.record(cls[i].Run), r.encode())
		}
		r.FinishedAt = finished
		return clientv3.OpPut(c.keys.record(cls[i].Run), r.encode(), clientv3.WithLease(done))
	}
	terminal := slices.ContainsFunc(pending, func(i int) bool { return outcomes[i].Terminal() })
	// Each try gets a share of the time the caller gave the release (a
	// lease, in the runner), not of the claims' leases: the holder's
	// keep-alive renews those fields until the release has landed (a data
	// race the explorer found under the race detector).
	budget := 30 * time.Second
	if d, ok := ctx.Deadline(); ok {
		budget = time.Until(d)
	}
	attempt := attemptTimeout(budget)

	type late struct {
		i      int
		modRev int64
	}
	var lates []late
	for start := 0; start < len(pending); start += maxOps {
		chunk := pending[start:min(start+maxOps, len(pending))]
		resp, err := c.commitDone(ctx, attempt, terminal, func(done clientv3.LeaseID) []clientv3.Op {
			ops := make([]clientv3.Op, len(chunk))
			for k, i := range chunk {
				live := c.keys.live(cls[i].Run)
				ops[k] = clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.Value(live), "=", cls[i].Token)},
					[]clientv3.Op{put(i, done), clientv3.OpDelete(live)},
					[]clientv3.Op{clientv3.OpGet(c.keys.record(cls[i].Run))})
			}
			return ops
		})
		if err != nil {
			// Earlier chunks stand; this one and later ones may or
			// may not have taken effect.
			fail(pending[start:], err)
			return errs
		}
		for k, i := range chunk {
			tr := resp.Responses[k].GetResponseTxn()
			if tr == nil || tr.Succeeded {
				continue
			}
			var kvs = tr.Responses[0].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				fail([]int{i}, claim.ErrLeaseLost)
				continue
			}
			r, err := decodeRecord(string(kvs[0].Key), kvs[0].Value)
			switch {
			case err != nil:
				fail([]int{i}, err)
			case r.Token != cls[i].Token:
				fail([]int{i}, claim.ErrLeaseLost)
			case r.Status == outcomes[i]:
				// A retry of a release that took effect.
			case r.Status == claim.Running:
				lates = append(lates, late{i, kvs[0].ModRevision})
			default:
				fail([]int{i}, claim.ErrLeaseLost)
			}
		}
	}
	for start := 0; start < len(lates); start += maxOps {
		chunk := lates[start:min(start+maxOps, len(lates))]
		resp, err := c.commitDone(ctx, attempt, terminal, func(done clientv3.LeaseID) []clientv3.Op {
			ops := make([]clientv3.Op, len(chunk))
			for k, l := range chunk {
				run := cls[l.i].Run
				ops[k] = clientv3.OpTxn([]clientv3.Cmp{
					clientv3.Compare(clientv3.CreateRevision(c.keys.live(run)), "=", 0),
					clientv3.Compare(clientv3.ModRevision(c.keys.record(run)), "=", l.modRev),
				}, []clientv3.Op{put(l.i, done)}, []clientv3.Op{clientv3.OpGet(c.keys.record(run))})
			}
			return ops
		})
		for k, l := range chunk {
			if err != nil {
				fail([]int{l.i}, err)
				continue
			}
			tr := resp.Responses[k].GetResponseTxn()
			if tr.GetSucceeded() {
				continue
			}
			// An earlier try that took effect left the record with
			// this claim's token and outcome; else the run was taken
			// over meanwhile.
			var r record
			var derr error = claim.ErrLeaseLost
			if rs := tr.GetResponses(); len(rs) == 1 {
				if kvs := rs[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
					r, derr = decodeRecord(string(kvs[0].Key), kvs[0].Value)
				}
			}
			if derr != nil || r.Token != cls[l.i].Token || r.Status != outcomes[l.i] {
				fail([]int{l.i}, claim.ErrLeaseLost)
			}
		}
	}
	return errs
}

// commitDone sends one transaction of the operations ops builds, given
// the done lease when terminal says some record needs it. A done lease
// that is gone (revoked, or the cluster restored from a backup) is
// replaced and the transaction sent once more.
func (c *Claimer) commitDone(ctx context.Context, attempt time.Duration, terminal bool, ops func(done clientv3.LeaseID) []clientv3.Op) (*clientv3.TxnResponse, error) {
	for try := 0; ; try++ {
		var done clientv3.LeaseID
		if terminal {
			var err error
			if done, err = c.done.get(ctx, &c.unanswered, attempt, c.cli); err != nil {
				return nil, c.translate(ctx, err)
			}
		}
		s, _ := c.guard.send(0)
		resp, err := retry(ctx, &c.unanswered, attempt, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return c.cli.Txn(ctx).Then(ops(done)...).Commit()
		})
		if err == nil {
			c.seen(s, resp.Header) // noticed here, refused by the next claim
		}
		if terminal && try == 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			c.done.forget(done)
			continue
		}
		if err != nil {
			return nil, c.translate(ctx, err)
		}
		return resp, nil
	}
}

// doneLease is the lease finished runs' records are written under, so
// that etcd forgets them done_ttl after they finished, as a Redis done
// marker expires. One lease serves every release for doneReuse after its
// grant, and lasts ttl+doneReuse: a record lives at least ttl and at most
// ttl+doneReuse, for one lease grant per doneReuse rather than one per
// release.
type doneLease struct {
	ttl, reuse time.Duration
	sem        chan struct{} // held while the lease is read or granted

	id      clientv3.LeaseID
	renewAt time.Time // local monotonic; when a new lease is due
}

func newDoneLease(ttl time.Duration) *doneLease {
	return &doneLease{ttl: ttl, reuse: min(time.Hour, max(ttl/8, time.Second)), sem: make(chan struct{}, 1)}
}

func (d *doneLease) get(ctx context.Context, u *claim.Unanswered, attempt time.Duration, cli *clientv3.Client) (clientv3.LeaseID, error) {
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-d.sem }()
	if d.id != 0 && time.Now().Before(d.renewAt) {
		return d.id, nil
	}
	// The lease runs from after now: used until now+reuse, it has at
	// least ttl left for any record written under it.
	now := time.Now()
	g, err := retry(ctx, u, attempt, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return cli.Grant(ctx, leaseSeconds(d.ttl+d.reuse))
	})
	if err != nil {
		return 0, err
	}
	d.id, d.renewAt = g.ID, now.Add(d.reuse)
	return d.id, nil
}

// forget drops id, which etcd no longer knows, so the next get grants a
// new lease.
func (d *doneLease) forget(id clientv3.LeaseID) {
	d.sem <- struct{}{}
	defer func() { <-d.sem }()
	if d.id == id {
		d.id = 0
	}
}
