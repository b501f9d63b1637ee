// Package etcd is a claim.Claimer on an etcd cluster (v3 API,
// go.etcd.io/etcd/client/v3). A replica wins a run by creating the run's
// live key under an etcd lease, in a transaction that also writes the
// run's record; etcd deletes the key when the lease expires, and the run
// can then be taken over. Leases are measured by the cluster's leader,
// never by a replica, in whole seconds and at least 1.5 election timeouts
// (2s at etcd's defaults): a shorter lease, such as a retry's backoff, is
// held that long. Fences are etcd revisions, which grow with every write
// and survive restarts and leader changes. See keys.go for the key space.
//
// A claim costs two round trips (a lease grant, then the transaction), a
// takeover three, a renewal two, a release one; a batch of runs shares
// them. Times in records are the writing replica's clock: etcd offers
// none.
//
// Operating the cluster: every claim, renewal and release is a write, and
// etcd keeps old revisions until it compacts them, so run it with
// auto-compaction (--auto-compaction-retention); nothing here reads an
// old revision. A cluster restored from a snapshot goes back to the
// snapshot's revision, and fences with it: restore with a revision bump
// (etcdutl snapshot restore --bump-revision) above every fence handed out.
// A claimer that reads a revision below one it read before (or another
// cluster id) tells the runner its backend lost its data and holds every
// run for a lease (see lossGuard).
package etcd

import (
	"cmp"
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Options configure a Claimer.
type Options struct {
	// Instance is the holder id written into claims.
	Instance string
	// Prefix starts every key (default "scheduler/").
	Prefix string
	// DoneTTL is how long a finished run's record is kept, so that a
	// late replica finds it done (default 48h).
	DoneTTL time.Duration
}

// Claimer grants claims through keys of an etcd cluster. It is safe for
// concurrent use.
type Claimer struct {
	cli      *clientv3.Client
	instance string
	keys     keyspace
	done     *doneLease
	guard    lossGuard
	revs     revs
	// unanswered holds takeovers of lapsed leases back after the cluster
	// left calls of this claimer unanswered (claim.Unanswered, retry).
	unanswered claim.Unanswered
	undos      claim.Stragglers // undoLater's, which Close waits for
	unseen     claim.Unseen     // bids whose outcome this claimer never heard
}

var (
	_ claim.Claimer        = (*Claimer)(nil)
	_ claim.TakeoverHolder = (*Claimer)(nil)
	_ claim.Settler        = (*Claimer)(nil)
)

// TakeoversHeld implements claim.TakeoverHolder.
func (c *Claimer) TakeoversHeld(lease time.Duration) bool { return c.unanswered.Hold(lease) }

// Settle implements claim.Settler.
func (c *Claimer) Settle() { c.unanswered.Settle() }

// New returns a Claimer on cli, which it owns: Close closes it.
func New(cli *clientv3.Client, o Options) *Claimer {
	if cli == nil {
		panic("etcd: nil client")
	}
	c := &Claimer{cli: cli, instance: o.Instance, keys: keyspace(cmp.Or(o.Prefix, "scheduler/")),
		done: newDoneLease(cmp.Or(o.DoneTTL, 48*time.Hour))}
	c.unanswered.Start()
	return c
}

// maxRounds bounds how often one Claim call bids again for a run that
// changed under it (a takeover read, then lost to another replica's).
const maxRounds = 4

// bid is one run's next try in a Claim call: to create its record
// (modRev 0), or to take over the record read at modRev.
type bid struct {
	i       int // index in the call's runs
	run     claim.Run
	modRev  int64
	prev    []byte // the record read at modRev, which an undo puts back
	attempt int
	// adopt, when set, is the token of this claimer's own unseen bid
	// whose grant the live key holds (claim.Unseen): the bid takes that
	// grant, its token and start, onto this call's lease.
	adopt string
}

// Claim implements claim.Claimer. It grants one lease for the batch, then
// sends each chunk of runs as one transaction of nested ones, one per
// run: if the live key is absent and the record is as last read (absent
// on the first round), create the live key under the lease and write the
// record; else read both. A run whose record shows it was handed back or
// its lease ran out is bid for again, with attempt+1, in a second round.
func (c *Claimer) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	claims := make([]*claim.Claim, len(runs))
	errs, valid := claim.CheckClaimBatch(ctx, runs, lease)
	if len(valid) == 0 {
		return claims, errs
	}
	fail := func(bids []bid, err error) {
		for _, b := range bids {
			errs[b.i] = fmt.Errorf("claim %s: %w", b.run.ID(), err)
		}
	}
	bids := make([]bid, len(valid))
	for k, i := range valid {
		bids[k] = bid{i: i, run: claim.Run{Job: runs[i].Job, At: runs[i].At.UTC()}, attempt: 1}
	}
	// lost refuses every grant of the call: the cluster lost its data
	// (see lossGuard), and holders from before may still trust theirs.
	lost := func(loss *claim.DataLossError) ([]*claim.Claim, []error) {
		for _, i := range valid {
			claims[i], errs[i] = nil, fmt.Errorf("claim %s: %w: %w", runs[i].ID(), loss, claim.ErrHeld)
		}
		return claims, errs
	}
	s, loss := c.guard.send(lease)
	if loss != nil {
		return lost(loss)
	}
	// The lease starts when the leader applies the grant, after this;
	// the holder's trust window counts from here.
	requested := time.Now()
	attempt := attemptTimeout(lease)
	g, err := retry(ctx, &c.unanswered, attempt, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return c.cli.Grant(ctx, leaseSeconds(lease))
	})
	if err != nil {
		fail(bids, c.translate(ctx, err))
		return claims, errs
	}
	if loss := c.seen(s, g.ResponseHeader); loss != nil {
		return lost(loss)
	}
	granted := false // a run granted on g: g stays, as the undo of a lost chunk could revoke it
	for round := 0; len(bids) > 0; round++ {
		if round == maxRounds {
			fail(bids, fmt.Errorf("%w: it changed hands while this replica bid", claim.ErrHeld))
			break
		}
		var next []bid
		for start := 0; start < len(bids); start += maxOps {
			chunk := bids[start:min(start+maxOps, len(bids))]
			ops := make([]clientv3.Op, len(chunk))
			tokens, wrote := make([]string, len(chunk)), make([]string, len(chunk))
			for k, b := range chunk {
				tokens[k] = cmp.Or(b.adopt, newToken(requested))
				ops[k], wrote[k] = c.bidOp(b, tokens[k], int64(k), requested, lease, g.ID)
			}
			s, _ := c.guard.send(lease)
			resp, err := retry(ctx, &c.unanswered, attempt, func(ctx context.Context) (*clientv3.TxnResponse, error) {
				return c.cli.Txn(ctx).Then(ops...).Commit()
			})
			if err != nil {
				// Grants of earlier chunks stand; nothing of this one
				// or later ones is known to. This one may have landed
				// all the same (its caller gave up, or the answer was
				// lost): undone, or its grants would hold their runs
				// for a lease with nobody to run them.
				c.undoLater(ctx, chunk, tokens, wrote, g.ID, !granted, requested.Add(lease))
				fail(append(next, bids[start:]...), c.translate(ctx, err))
				return claims, errs
			}
			if loss := c.seen(s, resp.Header); loss != nil {
				// The keys this lease holds hold nothing anyone may
				// trust: let them go now, not when the lease ends.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				_, _ = c.cli.Revoke(rctx, g.ID)
				cancel()
				return lost(loss)
			}
			for k, b := range chunk {
				tr := resp.Responses[k].GetResponseTxn()
				switch {
				case tr == nil:
					errs[b.i] = fmt.Errorf("claim %s: etcd: malformed transaction response", b.run.ID())
				case tr.Succeeded || ownLive(tr, tokens[k], g.ID) != nil:
					// A live key holding this bid's token on this call's
					// lease was written by an earlier try of this
					// transaction.
					rev := resp.Header.Revision
					if !tr.Succeeded {
						rev = ownLive(tr, tokens[k], g.ID).ModRevision
					}
					granted = true
					claims[b.i] = &claim.Claim{Run: b.run, Token: tokens[k], Holder: c.instance,
						Fence: fenceOf(rev, int64(k)), Attempt: b.attempt,
						Deadline: requested.Add(lease).UTC(), Requested: requested, Lease: lease}
					c.revs.set(tokens[k], rev, requested.Add(lease))
				default:
					if again, err := c.judge(b, tr.Responses, lease); err != nil {
						errs[b.i] = fmt.Errorf("claim %s: %w", b.run.ID(), err)
					} else {
						next = append(next, again)
					}
				}
			}
		}
		bids = next
	}
	return claims, errs
}

// bidOp is b's nested transaction, and the record it writes.
func (c *Claimer) bidOp(b bid, token string, slot int64, start time.Time, lease time.Duration, id clientv3.LeaseID) (clientv3.Op, string) {
	live, rec := c.keys.live(b.run), c.keys.record(b.run)
	started := start
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(live), "=", 0)}
	if b.adopt != "" {
		// The grant keeps its token, its start (in the token) and its
		// attempt; its lease is this call's, and it is fenced anew, as
		// a grant made now (this revision and slot): a grant of the job
		// may have been made since the unseen one, and a fence must rise
		// with what its holder could have seen. Nobody heard the unseen
		// grant's fence. The record is rewritten, so an undo of the
		// unseen bid, if it lands late, finds another record and undoes
		// nothing.
		cmps[0] = clientv3.Compare(clientv3.Value(live), "=", b.adopt)
		started = startOf(b.adopt)
	}
	if b.modRev == 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(rec), "=", 0))
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(rec), "=", b.modRev))
	}
	r := record{Job: b.run.Job, At: b.run.At, Status: claim.Running, Token: token, Holder: c.instance,
		Slot: slot, Attempt: b.attempt, StartedAt: started.UTC(), LeaseUntil: start.Add(lease).UTC()}
	v := r.encode()
	return clientv3.OpTxn(cmps,
		[]clientv3.Op{clientv3.OpPut(live, token, clientv3.WithLease(id)), clientv3.OpPut(rec, v)},
		[]clientv3.Op{clientv3.OpGet(live), clientv3.OpGet(rec)}), v
}

// ownLive is the live key a lost bid read, if it holds token on lease
// id: the bid won in an earlier try of its transaction, whose answer was
// lost. Else nil. (An adopting bid's token is on the key before it wins:
// its lease tells.)
func ownLive(tr *pb.TxnResponse, token string, id clientv3.LeaseID) *mvccpb.KeyValue {
	if len(tr.Responses) != 2 {
		return nil
	}
	live := tr.Responses[0].GetResponseRange().GetKvs()
	if len(live) == 0 || string(live[0].Value) != token || live[0].Lease != int64(id) {
		return nil
	}
	return live[0]
}

// judge reads a lost bid's live key and record: held, done, or worth
// another bid, for a claim of lease.
func (c *Claimer) judge(b bid, got []*pb.ResponseOp, lease time.Duration) (bid, error) {
	if len(got) != 2 {
		return bid{}, fmt.Errorf("etcd: malformed transaction response")
	}
	live, recs := got[0].GetResponseRange().GetKvs(), got[1].GetResponseRange().GetKvs()
	switch {
	case len(live) > 0 && len(recs) > 0:
		if tok, ok := c.unseen.Take(b.run.ID()); ok && string(live[0].Value) == tok {
			// This claimer's own grant, which it never heard of.
			if r, err := decodeRecord(string(recs[0].Key), recs[0].Value); err == nil && r.Token == tok && r.Status == claim.Running {
				return bid{i: b.i, run: b.run, modRev: recs[0].ModRevision, prev: recs[0].Value, attempt: r.Attempt, adopt: tok}, nil
			}
		}
		return bid{}, claim.ErrHeld
	case len(live) > 0:
		return bid{}, claim.ErrHeld
	case len(recs) == 0:
		// Its finished record expired (done_ttl) since: a fresh run.
		return bid{i: b.i, run: b.run, attempt: 1}, nil
	}
	r, err := decodeRecord(string(recs[0].Key), recs[0].Value)
	switch {
	case err != nil:
		return bid{}, err
	case !r.Status.Live():
		return bid{}, claim.ErrDone
	case r.Status == claim.Running && c.unanswered.Hold(lease):
		// Its lease ran out, and etcd deleted the live key, while the
		// cluster left this replica's calls unanswered: a stall (its
		// members stopped, or without a leader) that may have kept the
		// holder from renewing or releasing. When the members resume,
		// the leader revokes every lease that ran out meanwhile; a
		// takeover then ran a finished run again before its holder's
		// retried release landed (the explorer, with the members
		// stopped: 2 of 12 seeds). A new claimer starts so held
		// (claim.Unanswered.Start): it knows nothing of a stall before.
		return bid{}, fmt.Errorf("%w: its lease ran out, and this replica has not yet heard the cluster answer for a lease"+
			" (it has just started, or the cluster left its calls unanswered); its holder's release may still land,"+
			" so it is not taken over yet", claim.ErrHeld)
	}
	// Handed back, or its lease ran out and etcd deleted the live key.
	return bid{i: b.i, run: b.run, modRev: recs[0].ModRevision, prev: recs[0].Value, attempt: r.Attempt + 1}, nil
}

// undoLater undoes, on a goroutine of its own and best effort within a
// second, the bids of a transaction whose outcome is unknown (its caller
// gave up, or the answer was lost), bid k writing the record wrote[k] and
// its live key on lease id: where a record is still the bid's, its
// live key goes and the record is put back as it was before the bid
// (none, for a fresh run), so the next claim of the run is granted at the
// attempt it would have been. The transaction may still be on its way,
// and etcd may apply it after the undo: when revoke says nothing else
// holds id, id is revoked first, and a bid applied after that fails for
// want of its lease. The undo may be lost too (the cluster stalled): each
// bid's token is remembered until its lease would have run out (until),
// and the next claim of its run takes the grant, if the bid won, instead
// of being held off by it (claim.Unseen).
func (c *Claimer) undoLater(ctx context.Context, bids []bid, tokens, wrote []string, id clientv3.LeaseID, revoke bool, until time.Time) {
	ops := make([]clientv3.Op, len(bids))
	for k, b := range bids {
		c.unseen.Note(b.run.ID(), tokens[k], until)
		live, rec := c.keys.live(b.run), c.keys.record(b.run)
		restore := clientv3.OpDelete(rec)
		if b.modRev != 0 {
			restore = clientv3.OpPut(rec, string(b.prev))
		}
		ops[k] = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(rec), "=", wrote[k])},
			[]clientv3.Op{clientv3.OpDelete(live), restore}, nil)
	}
	c.undos.Go(func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if revoke {
			_, _ = c.cli.Revoke(uctx, id)
		}
		_, _ = c.cli.Txn(uctx).Then(ops...).Commit()
	})
}

// Renew implements claim.Claimer. An etcd lease can be neither shortened
// nor given another TTL, so a renewal grants a new lease and moves the
// live key onto it, in a transaction that compares the key's token. The
// old lease expires on its own, holding nothing.
//
// A renewal after the claim's lease ran out on this replica's monotonic
// clock (Requested+Lease) is refused without asking: etcd deletes an
// expired key only when the leader revokes its lease, a moment later,
// and a renewal in between would revive a claim its holder has stopped
// trusting.
func (c *Claimer) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	if err := claim.CheckRenew(cl, lease); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	requested := time.Now()
	if !requested.Before(cl.Requested.Add(cl.Lease)) {
		return fmt.Errorf("renew %s: %w: its %v lease ran out", cl.ID(), claim.ErrLeaseLost, cl.Lease)
	}
	// No claim granted before a loss may be renewed on the cluster that
	// forgot it, and none was granted since while the guard holds.
	lost := func(loss *claim.DataLossError) error {
		return fmt.Errorf("renew %s: %w: %w", cl.ID(), loss, claim.ErrLeaseLost)
	}
	s, loss := c.guard.send(lease)
	if loss != nil {
		return lost(loss)
	}
	attempt := attemptTimeout(min(lease, cl.Lease))
	g, err := retry(ctx, &c.unanswered, attempt, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return c.cli.Grant(ctx, leaseSeconds(lease))
	})
	if err != nil {
		return fmt.Errorf("renew %s: %w", cl.ID(), c.translate(ctx, err))
	}
	if loss := c.seen(s, g.ResponseHeader); loss != nil {
		return lost(loss)
	}
	r := recordOf(cl, claim.Running, requested.Add(lease))
	live := c.keys.live(cl.Run)
	at, known := c.revs.get(cl.Token)
	for round := 0; ; round++ {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Value(live), "=", cl.Token)}
		if known {
			// Only the holder's latest write (see revs).
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(live), "=", at))
		}
		s, _ = c.guard.send(lease)
		// A try that took effect leaves the key holding the token, on g:
		// the next one finds it so.
		resp, err := retry(ctx, &c.unanswered, attempt, func(ctx context.Context) (*clientv3.TxnResponse, error) {
			return c.cli.Txn(ctx).If(cmps...).
				Then(clientv3.OpPut(live, cl.Token, clientv3.WithLease(g.ID)), clientv3.OpPut(c.keys.record(cl.Run), r.encode())).
				Else(clientv3.OpGet(live)).
				Commit()
		})
		if err == nil {
			if loss := c.seen(s, resp.Header); loss != nil {
				return lost(loss)
			}
		}
		if err != nil {
			return fmt.Errorf("renew %s: %w", cl.ID(), c.translate(ctx, err))
		}
		var kv *mvccpb.KeyValue
		if !resp.Succeeded && len(resp.Responses) == 1 {
			if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
				kv = kvs[0]
			}
		}
		switch {
		case resp.Succeeded:
			at = resp.Header.Revision
		case kv == nil || string(kv.Value) != cl.Token:
			c.revs.drop(cl.Token)
			return fmt.Errorf("renew %s: %w", cl.ID(), claim.ErrLeaseLost)
		case clientv3.LeaseID(kv.Lease) == g.ID:
			// An earlier try of this renewal took effect.
			at = kv.ModRevision
		case round < maxRounds:
			// Still this holder's, written by a try of an earlier
			// renewal applied late: renew over it.
			at, known = kv.ModRevision, true
			continue
		default:
			return fmt.Errorf("renew %s: %w: its live key kept changing under the renewal", cl.ID(), claim.ErrLeaseLost)
		}
		c.revs.set(cl.Token, at, requested.Add(lease))
		cl.Requested, cl.Lease, cl.Deadline = requested, lease, r.LeaseUntil
		return nil
	}
}

// Reach asks one member how many keys lie under the prefix: a
// serializable read, which needs no quorum, so it fails only where no
// endpoint can be reached (a wrong address, TLS the endpoints do not
// speak) or the user may not read the prefix. The opener calls it: the
// client dials lazily, so without it a replica whose endpoints are all
// wrong started and failed every claim for good (an outside review).
func (c *Claimer) Reach(ctx context.Context) error {
	_, err := c.cli.Get(ctx, string(c.keys), clientv3.WithPrefix(), clientv3.WithSerializable(), clientv3.WithCountOnly())
	return c.translate(ctx, err)
}

// Ping implements claim.Claimer with a write that changes nothing: a
// transaction that would put the ping key if it had a negative create
// revision, which no key has. A transaction with a write in it goes
// through the cluster's log like a claim, so it fails where a claim would
// (no quorum, a NOSPACE alarm, a user without write access), which a
// read would pass; one whose writes do not run leaves the revision alone.
func (c *Claimer) Ping(ctx context.Context) error {
	key := c.keys.ping()
	s, _ := c.guard.send(0)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "<", 0)).
		Then(clientv3.OpPut(key, "")).
		Commit()
	// The readiness probe's pings are calls too: a replica with nothing
	// to claim or renew learns of a stall from them.
	noteTry(ctx, &c.unanswered, err, err != nil && (ctx.Err() != nil || timedOut(err)), false)
	if err != nil {
		return fmt.Errorf("ping: %w", c.translate(ctx, err))
	}
	c.seen(s, resp.Header) // the claims refuse while a loss is guarded
	return nil
}

// Close implements claim.Claimer: it closes the client, once the undos
// under way have reached the cluster or given up.
func (c *Claimer) Close() error {
	c.undos.Wait()
	return c.cli.Close()
}
