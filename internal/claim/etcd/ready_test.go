package etcd_test

import (
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestReadinessFailsWhereClaimsDo: a cluster out of space (the NOSPACE
// alarm: etcd's quota reached) still answers reads and refuses every
// write, claims included. Readiness is a write that changes nothing, so
// it says not ready there, and ready again once the alarm is disarmed;
// it never moves the revision.
func TestReadinessFailsWhereClaimsDo(t *testing.T) {
	ctx := t.Context()
	cluster := testenv.StartEtcd(t, 1)
	c := backends.Prepare(t, "etcd", backends.Options{Servers: cluster.Endpoints()}).Open("replica-a")
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	st, err := cli.Status(ctx, cluster.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	member := st.Header.MemberId

	before, err := cli.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("readiness of a healthy cluster: %v", err)
	}
	after, err := cli.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	if before.Header.Revision != after.Header.Revision {
		t.Fatalf("readiness moved the revision from %d to %d", before.Header.Revision, after.Header.Revision)
	}

	if _, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: member, Alarm: pb.AlarmType_NOSPACE,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Get(ctx, "any"); err != nil {
		t.Fatalf("a read under NOSPACE: %v (the alarm should leave reads alone)", err)
	}
	if _, err := claim.ClaimOne(ctx, c, claim.Run{Job: "job.ready", At: base}, time.Minute); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("claim under NOSPACE: %v, want ErrUnavailable", err)
	}
	if err := c.Ping(ctx); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("readiness under NOSPACE: %v, want ErrUnavailable", err)
	}

	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: member, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("readiness once the alarm is disarmed: %v", err)
	}
	if _, err := claim.ClaimOne(ctx, c, claim.Run{Job: "job.ready", At: base}, time.Minute); err != nil {
		t.Fatalf("claim once the alarm is disarmed: %v", err)
	}
}
