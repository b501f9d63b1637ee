package etcd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// replyLoser is a gRPC client interceptor that loses the replies of
// transactions: while armed, a Txn goes to the cluster and takes effect
// there, and its caller hears nothing until its try's time runs out, as
// behind a link that dropped the answer, or a member that stalled after
// applying.
type replyLoser struct {
	armed atomic.Int32 // how many more Txn replies to lose
	sent  atomic.Int32 // Txn requests sent, lost or not
	// hold, when set, keeps the next Txn from the cluster altogether,
	// as a stalled member keeps a request it has read: its caller hears
	// nothing until its try runs out, and late sends it on afterwards.
	hold atomic.Bool
	late func(context.Context) error
	// only, when set, picks the replies that may be lost: others pass,
	// and leave the count armed.
	only func(*pb.TxnResponse) bool
	// unsent, when set, refuses the calls it picks without sending them,
	// as a stalled cluster leaves them unanswered: an undo, say.
	unsent func(method string, req any) bool
	// gone, when set, is called as a reply is lost, its transaction
	// applied: a caller that gives up then (cancels) hears nothing of a
	// grant that stands.
	gone atomic.Pointer[context.CancelFunc]
}

func (l *replyLoser) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if l.unsent != nil && l.unsent(method, req) {
		return status.Error(codes.Unavailable, "refused unsent by the test")
	}
	if method != "/etcdserverpb.KV/Txn" {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if l.hold.CompareAndSwap(true, false) {
		l.late = func(ctx context.Context) error {
			return invoker(ctx, method, req, new(pb.TxnResponse), cc, opts...)
		}
		<-ctx.Done()
		return status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error())
	}
	l.sent.Add(1)
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && l.only != nil && !l.only(reply.(*pb.TxnResponse)) {
		return nil
	}
	if err != nil || l.armed.Add(-1) < 0 {
		l.armed.Store(0)
		return err
	}
	if gone := l.gone.Load(); gone != nil {
		(*gone)()
	}
	<-ctx.Done()
	return status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error())
}

// openOn opens a claimer for instance on endpoints, its keys under
// prefix, its client dialled with dial, settled (claim.Settler); closed
// when t ends.
func openOn(t *testing.T, endpoints []string, prefix, instance string, dial ...grpc.DialOption) *Claimer {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second,
		Logger: zap.NewNop(), DialOptions: dial})
	if err != nil {
		t.Fatal(err)
	}
	c := New(cli, Options{Instance: instance, Prefix: prefix})
	c.Settle() // a replica up for a while: no start hold
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestAWriteWhoseReplyWasLostIsRecognisedWhenSentAgain: a claim, renewal
// or release whose transaction took effect but whose reply was lost is
// sent again when its try runs out (retry), and the try sent again must
// recognise the first one's effect by its token: the claim is granted
// with the fence its live key was created at, not refused as held by
// itself; the renewal and the release stand, not reported lost. Refused,
// the run would sit held by nobody for a lease, and a release reported
// lost would have the runner record a run that succeeded as lease_lost.
func TestAWriteWhoseReplyWasLostIsRecognisedWhenSentAgain(t *testing.T) {
	cluster := testenv.StartEtcd(t, 1)
	loser := &replyLoser{}
	open := func(instance string, dial ...grpc.DialOption) *Claimer {
		return openOn(t, cluster.Endpoints(), "resend/", instance, dial...)
	}
	lossy := open("lossy", grpc.WithUnaryInterceptor(loser.intercept))
	other := open("other")
	ctx := func() context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	const lease = testenv.EtcdLease
	// lose runs call with the next Txn reply lost and checks that the
	// transaction was sent again.
	lose := func(what string, call func() error) {
		t.Helper()
		loser.armed.Store(1)
		before := loser.sent.Load()
		if err := call(); err != nil {
			t.Fatalf("%s whose first reply was lost: %v", what, err)
		}
		if sent := loser.sent.Load() - before; sent < 2 || loser.armed.Load() != 0 {
			t.Fatalf("%s: %d transactions sent, %d replies left to lose; want the lost one sent again", what, sent, loser.armed.Load())
		}
	}
	base := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)

	run := claim.Run{Job: "job.resend", At: base}
	var cl *claim.Claim
	lose("a claim", func() (err error) {
		cl, err = claim.ClaimOne(ctx(), lossy, run, lease)
		return err
	})
	live, err := lossy.cli.Get(ctx(), lossy.keys.live(run))
	if err != nil || len(live.Kvs) != 1 {
		t.Fatalf("live key: %v, %v", live, err)
	}
	if string(live.Kvs[0].Value) != cl.Token || cl.Fence != fenceOf(live.Kvs[0].CreateRevision, 0) || cl.Attempt != 1 {
		t.Fatalf("granted %+v; live key %q created at revision %d: want its token, fence %d, attempt 1",
			cl, live.Kvs[0].Value, live.Kvs[0].CreateRevision, fenceOf(live.Kvs[0].CreateRevision, 0))
	}
	if _, err := claim.ClaimOne(ctx(), other, run, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("another replica's claim of the run granted to the lossy one: %v, want held", err)
	}

	lose("a renewal", func() error { return lossy.Renew(ctx(), cl, lease) })
	if _, err := claim.ClaimOne(ctx(), other, run, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("another replica's claim after the renewal: %v, want held", err)
	}

	lose("a release", func() error { return claim.ReleaseOne(ctx(), lossy, cl, claim.Succeeded) })
	if _, err := claim.ClaimOne(ctx(), other, run, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("another replica's claim after the release: %v, want done", err)
	}
	recs, err := other.History(ctx(), run.Job, 10)
	if err != nil || len(recs) != 1 || recs[0].Status != claim.Succeeded || recs[0].Holder != "lossy" || recs[0].Fence != cl.Fence {
		t.Fatalf("history: %+v, %v; want one run, succeeded, under the lossy replica's grant", recs, err)
	}

	// A handback (not terminal: no done lease) whose reply was lost
	// stands too, and the run is granted again, attempt 2.
	run2 := claim.Run{Job: "job.resend", At: base.Add(time.Minute)}
	cl2, err := claim.ClaimOne(ctx(), lossy, run2, lease)
	if err != nil {
		t.Fatal(err)
	}
	lose("a handback", func() error { return claim.ReleaseOne(ctx(), lossy, cl2, claim.Interrupted) })
	again, err := claim.ClaimOne(ctx(), other, run2, lease)
	if err != nil || again.Attempt != 2 || again.Fence <= cl2.Fence {
		t.Fatalf("claim after the handback: %+v, %v; want attempt 2 with a higher fence than %d", again, err, cl2.Fence)
	}
}

// heldBehindALoser claims a run through a claimer whose transactions go
// through a replyLoser, on a one-member cluster of its own, under lease.
func heldBehindALoser(t *testing.T, ctx context.Context, name string, lease time.Duration) (*replyLoser, *clientv3.Client, *Claimer, claim.Run, *claim.Claim) {
	t.Helper()
	cluster := testenv.StartEtcd(t, 1)
	loser := &replyLoser{}
	c := openOn(t, cluster.Endpoints(), name+"/", "holder", grpc.WithUnaryInterceptor(loser.intercept))
	run := claim.Run{Job: "job." + name, At: time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)}
	cl, err := claim.ClaimOne(ctx, c, run, lease)
	if err != nil {
		t.Fatal(err)
	}
	return loser, c.cli, c, run, cl
}

// TestARenewalAppliedLateCannotShortenTheLease: a renewal grants a new
// etcd lease and moves the live key onto it. A try of one renewal that a
// stalled member applies after a later renewal has landed must not move
// the key back onto the earlier renewal's lease, which expires first:
// etcd would delete the key, and grant the run to another replica, while
// its holder still trusted the later renewal.
func TestARenewalAppliedLateCannotShortenTheLease(t *testing.T) {
	const lease = 6 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	loser, cli, c, run, cl := heldBehindALoser(t, ctx, "late", lease)
	leaseOf := func() clientv3.LeaseID {
		t.Helper()
		got, err := cli.Get(ctx, c.keys.live(run))
		if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != cl.Token {
			t.Fatalf("live key: %+v, %v", got, err)
		}
		return clientv3.LeaseID(got.Kvs[0].Lease)
	}

	// The first renewal's first try is held; its second try lands.
	loser.hold.Store(true)
	if err := c.Renew(ctx, cl, lease); err != nil {
		t.Fatal(err)
	}
	first := leaseOf()
	if loser.late == nil {
		t.Fatal("no renewal try was held")
	}
	// The leases must end at different seconds for the later one to
	// outlive the earlier one.
	time.Sleep(1500 * time.Millisecond)
	if err := c.Renew(ctx, cl, lease); err != nil {
		t.Fatal(err)
	}
	second := leaseOf()
	if second == first {
		t.Fatalf("the second renewal left the key on the first one's lease %x", first)
	}
	// The held try arrives now, behind the second renewal.
	_ = loser.late(ctx)
	if now := leaseOf(); now != second {
		ttl, _ := cli.TimeToLive(ctx, now)
		t.Fatalf("a try of the first renewal, applied after the second, moved the key back onto lease %x (%ds left), "+
			"though its holder trusts the second renewal's lease %x until %s", now, ttl.TTL, second, time.Until(cl.TrustedUntil(0)).Round(time.Millisecond))
	}
	// And the claim goes on as before: renewed, and released.
	if err := c.Renew(ctx, cl, lease); err != nil {
		t.Fatalf("renewal after the late try: %v", err)
	}
	if err := claim.ReleaseOne(ctx, c, cl, claim.Succeeded); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// A renewal that gave up (its caller's time ran out) while its one try
// was held in a stalled member may still be applied afterwards: the live
// key moves onto that renewal's lease, at a revision its holder never
// saw. The holder's next renewal finds its token there on a lease not its
// own, and renews over it rather than report the lease lost: the key is
// still its own, and a holder cancelled for it would hand a live run to a
// takeover for nothing.
func TestARenewalThatGaveUpButLandedLaterIsRenewedOver(t *testing.T) {
	const lease = 6 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	loser, cli, c, run, cl := heldBehindALoser(t, ctx, "over", lease)
	live := func() *mvccpb.KeyValue {
		t.Helper()
		got, err := cli.Get(ctx, c.keys.live(run))
		if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != cl.Token {
			t.Fatalf("live key: %+v, %v", got, err)
		}
		return got.Kvs[0]
	}
	before := live()

	// The renewal's only try is held, and its caller gives up first.
	loser.hold.Store(true)
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	err := c.Renew(short, cl, lease)
	stop()
	if err == nil || loser.late == nil {
		t.Fatalf("renewal whose try was held: %v (held: %v), want an error", err, loser.late != nil)
	}
	// The held try lands now: the key moves onto its lease.
	if err := loser.late(ctx); err != nil {
		t.Fatal(err)
	}
	landed := live()
	if landed.ModRevision == before.ModRevision || landed.Lease == before.Lease {
		t.Fatalf("the held try did not land: the key is at revision %d on lease %x, as before", landed.ModRevision, landed.Lease)
	}

	// The next renewal renews over it.
	if err := c.Renew(ctx, cl, lease); err != nil {
		t.Fatalf("renewal after a given-up renewal landed: %v, want it renewed over", err)
	}
	now := live()
	if now.Lease == landed.Lease || now.ModRevision <= landed.ModRevision {
		t.Fatalf("the key stayed on the landed try's lease %x (revision %d)", landed.Lease, landed.ModRevision)
	}
	if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(now.Lease)); err != nil || ttl.TTL < int64(lease/time.Second)-2 {
		t.Fatalf("the renewed key's lease has %v left (%v), want about %v", ttl.TTL, err, lease)
	}
	if err := claim.ReleaseOne(ctx, c, cl, claim.Succeeded); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// TestAClaimGivenUpAfterItLandedIsUndone: a claim whose transaction took
// effect, but whose caller gave up before the reply came, is undone
// (undoLater): the live key goes, and the run's record is put back as it
// was before the bid, none for a fresh run, the lapsed holder's record
// for a takeover. The next claim is then granted at the attempt it would
// have been, with a fence above every earlier grant's: the undone grant
// never started. The conformance suite's given-up cases rarely catch a
// transaction between landing and answering; this one always does.
func TestAClaimGivenUpAfterItLandedIsUndone(t *testing.T) {
	cluster := testenv.StartEtcd(t, 1)
	// Only the reply of a bid that won is lost: a takeover's first round
	// bids for a fresh run, and loses.
	loser := &replyLoser{only: func(r *pb.TxnResponse) bool {
		return len(r.Responses) > 0 && r.Responses[0].GetResponseTxn().GetSucceeded()
	}}
	open := func(instance string, dial ...grpc.DialOption) *Claimer {
		return openOn(t, cluster.Endpoints(), "undo/", instance, dial...)
	}
	lossy := open("lossy", grpc.WithUnaryInterceptor(loser.intercept))
	other := open("other")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const lease = testenv.EtcdLease
	base := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	get := func(key string) *mvccpb.KeyValue {
		t.Helper()
		got, err := other.cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Kvs) == 0 {
			return nil
		}
		return got.Kvs[0]
	}
	// giveUp has lossy claim run, its reply lost, and gives the claim up
	// as the reply is lost: the transaction has landed (loser.only).
	giveUp := func(run claim.Run) {
		t.Helper()
		loser.armed.Store(1)
		cctx, stop := context.WithCancel(ctx)
		defer stop()
		loser.gone.Store(&stop)
		defer loser.gone.Store(nil)
		cl, err := claim.ClaimOne(cctx, lossy, run, time.Minute)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("claim of %s given up once it landed: %+v, %v; want the caller's context error", run.ID(), cl, err)
		}
		loser.armed.Store(0)
	}
	// undone waits until the undo has put run's record back to was.
	undone := func(run claim.Run, was *mvccpb.KeyValue) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			rec, live := get(lossy.keys.record(run)), get(lossy.keys.live(run))
			switch {
			case live == nil && was == nil && rec == nil,
				live == nil && was != nil && rec != nil && string(rec.Value) == string(was.Value):
				return
			case time.Now().After(deadline):
				t.Fatalf("%s, given up after it landed: record %+v, live key %+v; want the live key gone and the record as before the bid, %+v", run.ID(), rec, live, was)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// A fresh run: no record is left, and the next claim is attempt 1.
	fresh := claim.Run{Job: "job.undo", At: base}
	giveUp(fresh)
	undone(fresh, nil)
	if cl, err := claim.ClaimOne(ctx, other, fresh, lease); err != nil || cl.Attempt != 1 {
		t.Fatalf("claim after the undone grant: %+v, %v; want attempt 1", cl, err)
	}

	// A takeover of a lapsed grant: the lapsed holder's record is put
	// back, and the next takeover is attempt 2 above its fence.
	lapsed := claim.Run{Job: "job.undo", At: base.Add(time.Minute)}
	first, err := claim.ClaimOne(ctx, other, lapsed, lease)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); get(lossy.keys.live(lapsed)) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the %v lease of %s never lapsed", lease, lapsed.ID())
		}
	}
	was := get(lossy.keys.record(lapsed))
	giveUp(lapsed)
	undone(lapsed, was)
	cl, err := claim.ClaimOne(ctx, other, lapsed, lease)
	if err != nil || cl.Attempt != 2 || cl.Fence <= first.Fence {
		t.Fatalf("takeover after the undone one: %+v, %v; want attempt 2 above fence %d", cl, err, first.Fence)
	}
}

// unseenGrant has a claimer on a one-member cluster of its own claim
// run, its bid winning and both its reply and its undo lost (a stalled
// cluster answers neither), and returns it, another claimer on the same
// keys, and the fence the unseen grant was made with.
func unseenGrant(t *testing.T, run claim.Run) (lossy, other *Claimer, fence int64) {
	t.Helper()
	cluster := testenv.StartEtcd(t, 1)
	var undoLost atomic.Bool
	loser := &replyLoser{
		only: func(r *pb.TxnResponse) bool {
			return len(r.Responses) > 0 && r.Responses[0].GetResponseTxn().GetSucceeded()
		},
		// An undo revokes the call's lease, and deletes live keys.
		unsent: func(method string, req any) bool {
			if !undoLost.Load() {
				return false
			}
			if method == "/etcdserverpb.Lease/LeaseRevoke" {
				return true
			}
			txn, ok := req.(*pb.TxnRequest)
			return ok && len(txn.Success) > 0 && len(txn.Success[0].GetRequestTxn().GetSuccess()) > 0 &&
				txn.Success[0].GetRequestTxn().GetSuccess()[0].GetRequestDeleteRange() != nil
		},
	}
	open := func(instance string, dial ...grpc.DialOption) *Claimer {
		return openOn(t, cluster.Endpoints(), "unseen/", instance, dial...)
	}
	lossy, other = open("lossy", grpc.WithUnaryInterceptor(loser.intercept)), open("other")

	loser.armed.Store(1)
	undoLost.Store(true)
	// The caller gives up as the reply is lost: no try of the claim runs
	// out, so nothing holds this claimer's takeovers.
	short, stop := context.WithCancel(t.Context())
	loser.gone.Store(&stop)
	_, err := claim.ClaimOne(short, lossy, run, time.Minute)
	stop()
	if err == nil {
		t.Fatal("claim whose reply was lost: granted, want an error")
	}
	lossy.undos.Wait() // the undo, refused
	undoLost.Store(false)
	live, err := other.cli.Get(t.Context(), other.keys.live(run))
	if err != nil || len(live.Kvs) != 1 {
		t.Fatalf("live key after the lost undo: %+v, %v; want the unseen grant's", live, err)
	}
	return lossy, other, fenceOf(live.Kvs[0].CreateRevision, 0)
}
