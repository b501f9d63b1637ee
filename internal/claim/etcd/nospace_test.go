package etcd_test

import (
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestNoSpaceHoldsTakeoversUntilWritesLand: under the NOSPACE alarm (the
// quota reached) the cluster answers, but refuses every lease grant and
// write: a holder whose handler returned cannot release (its done marker
// needs a lease), and its lease lapses. Once the alarm is disarmed, the
// standby's bid must be held until the holder's retried release lands.
// Before, a refusal counted as an answer, the hold never started, and a
// standby ran a finished run again, 6 times in 18 (an outside review). A
// dead holder's run is still taken over, a lease after writes land.
func TestNoSpaceHoldsTakeoversUntilWritesLand(t *testing.T) {
	ctx := t.Context()
	lease := testenv.EtcdLease
	cluster := testenv.StartEtcd(t, 1)
	ns := backends.Prepare(t, "etcd", backends.Options{Servers: cluster.Endpoints()})
	holder, standby := ns.Open("holder"), ns.Open("standby")
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	st, err := cli.Status(ctx, cluster.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	alarm := &clientv3.AlarmMember{MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE}

	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	finished, dead := claim.Run{Job: "job.nospace", At: at}, claim.Run{Job: "job.nospace", At: at.Add(time.Minute)}
	cls, errs := holder.Claim(ctx, []claim.Run{finished, dead}, lease)
	for k, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", k, err)
		}
	}
	held := func(want bool, when string) {
		t.Helper()
		if th, ok := standby.Claimer.(claim.TakeoverHolder); ok && th.TakeoversHeld(lease) != want {
			t.Fatalf("%s: the standby says takeovers held: %v, want %v", when, !want, want)
		}
	}
	held(false, "before the alarm")

	if _, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: alarm.MemberID, Alarm: alarm.Alarm,
	}); err != nil {
		t.Fatal(err)
	}
	if err := claim.ReleaseOne(ctx, holder, cls[0], claim.Succeeded); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("the holder's release under NOSPACE: %v, want unavailable", err)
	}
	// The standby's bids meet the refusal from the start, as a busy
	// replica's do.
	if _, err := claim.ClaimOne(ctx, standby, claim.Run{Job: "job.other", At: at}, lease); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("a new run's claim under NOSPACE: %v, want unavailable", err)
	}
	held(true, "after a write refused for want of space")
	// Past the lease: the holder's lease lapses meanwhile.
	for end := time.Now().Add(2 * lease); time.Now().Before(end); time.Sleep(lease / 10) {
		if cl, err := claim.ClaimOne(ctx, standby, finished, lease); err == nil {
			t.Fatalf("%s granted to the standby under NOSPACE: %+v", finished.ID(), cl)
		}
	}
	held(true, "after two leases of refused writes")

	if _, err := cli.AlarmDisarm(ctx, alarm); err != nil {
		t.Fatal(err)
	}
	if _, err := claim.ClaimOne(ctx, standby, finished, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("the standby's bid once the alarm is disarmed: %v, want held: the holder's release has not landed yet", err)
	}
	if err := claim.ReleaseOne(ctx, holder, cls[0], claim.Succeeded); err != nil {
		t.Fatalf("the holder's retried release: %v, want it to land", err)
	}
	if _, err := claim.ClaimOne(ctx, standby, finished, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("the standby after the release: %v, want done", err)
	}
	cl, err := claimtest.ClaimWhenFreed(t, standby, dead, lease)
	if err != nil || cl.Attempt != 2 {
		t.Fatalf("the run of a holder that died under NOSPACE: %v, %v; want taken over, attempt 2", cl, err)
	}
	held(false, "once the dead holder's run was taken over")
}
