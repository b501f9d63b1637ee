package testenv

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/procs"
)

// EnvEtcdEndpoints names running etcd members (host:port, comma-separated)
// for the tests that do not start their own cluster.
const EnvEtcdEndpoints = "SCHEDULER_TEST_ETCD_ENDPOINTS"

// EtcdLease is the shortest lease a cluster of StartEtcd grants: etcd
// rounds a lease up to 1.5 election timeouts in whole seconds.
const EtcdLease = 2 * time.Second

// EtcdEndpoints returns the client addresses of an etcd cluster:
// SCHEDULER_TEST_ETCD_ENDPOINTS, or a private 3-member cluster started for
// t (see StartEtcd).
func EtcdEndpoints(t testing.TB) []string {
	t.Helper()
	if v := os.Getenv(EnvEtcdEndpoints); v != "" {
		return strings.Split(v, ",")
	}
	return StartEtcd(t, 3).Endpoints()
}

// StartEtcd starts a private etcd cluster of n members on free loopback
// ports, stopped (by pid) when t ends. Its data lives in a FastDir: etcd
// syncs its WAL at every commit, and on a disk other test binaries are
// writing to, a sync that waits for seconds delays heartbeats into
// leader elections the tests did not ask for. etcd runs the same code
// either way.
func StartEtcd(t testing.TB, n int) *procs.Etcd {
	t.Helper()
	if _, err := procs.EtcdBin(""); err != nil {
		Missing(t, "etcd", err.Error())
	}
	e, err := procs.StartEtcd(t.Context(), procs.EtcdOptions{Dir: FastDir(t), Members: n})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}
