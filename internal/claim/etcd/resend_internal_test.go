package etcd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

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
}

func (l *replyLoser) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method != "/etcdserverpb.KV/Txn" {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	l.sent.Add(1)
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil || l.armed.Add(-1) < 0 {
		l.armed.Store(0)
		return err
	}
	<-ctx.Done()
	return status.Error(codes.DeadlineExceeded, context.DeadlineExceeded.Error())
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
		cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second,
			Logger: zap.NewNop(), DialOptions: dial})
		if err != nil {
			t.Fatal(err)
		}
		c := New(cli, Options{Instance: instance, Prefix: "resend/"})
		t.Cleanup(func() { _ = c.Close() })
		return c
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
