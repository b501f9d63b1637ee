package etcd_test

import (
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestNoSpaceHoldsTakeoversUntilWritesLand: under the NOSPACE alarm (the
// quota reached, raised here through the maintenance API) the cluster
// answers, but refuses every lease grant and write: a holder whose
// handler returned cannot release (its done marker needs a lease). Before,
// the refusal counted as an answer, the hold never started, and a standby
// ran a finished run again once the alarm was disarmed
// (claimtest.RefusedWritesHoldTakeovers).
func TestNoSpaceHoldsTakeoversUntilWritesLand(t *testing.T) {
	cluster := testenv.StartEtcd(t, 1)
	ns := backends.Prepare(t, "etcd", backends.Options{Servers: cluster.Endpoints()})
	holder, standby := ns.Open("holder"), ns.Open("standby")
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	st, err := cli.Status(t.Context(), cluster.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	member := st.Header.MemberId
	refuse := func(on bool) {
		t.Helper()
		var err error
		if on {
			_, err = pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(t.Context(), &pb.AlarmRequest{
				Action: pb.AlarmRequest_ACTIVATE, MemberID: member, Alarm: pb.AlarmType_NOSPACE})
		} else {
			_, err = cli.AlarmDisarm(t.Context(), &clientv3.AlarmMember{MemberID: member, Alarm: pb.AlarmType_NOSPACE})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	claimtest.RefusedWritesHoldTakeovers(t, holder.Claimer, standby.Claimer, refuse, testenv.EtcdLease)
}
