package procs_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/scheduler-dev/scheduler/internal/procs"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// TestEtcdMemberKilledAndStartedKeepsItsData kills one member of a
// 3-member cluster (SIGKILL), writes through the other two, and starts it
// again on its ports and data: it catches up and serves what it missed.
func TestEtcdMemberKilledAndStartedKeepsItsData(t *testing.T) {
	if _, err := procs.EtcdBin(""); err != nil {
		testenv.Missing(t, "etcd", err.Error())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	e, err := procs.StartEtcd(ctx, procs.EtcdOptions{Dir: testenv.FastDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "before", "1"); err != nil {
		t.Fatal(err)
	}
	m := e.Members()[0]
	addr := m.Addr()
	m.Stop()
	// A write sent while the others elect a leader (if m led) may be
	// lost with the old leader and time out; the next one lands.
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Put(pctx, "while-down", "2")
		pcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("put with a member down: %v", err)
		}
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	one, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Addr()}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for _, k := range []string{"before", "while-down"} {
		resp, err := one.Get(ctx, k)
		if err != nil || len(resp.Kvs) != 1 || m.Addr() != addr {
			t.Fatalf("get %s from the restarted member on %s (was %s): %v, %v", k, m.Addr(), addr, resp, err)
		}
	}
}
