package testenv

import (
	"os"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/procs"
)

// EnvRedisClusterAddrs names the nodes of a running Redis Cluster
// (host:port, comma-separated: seeds, any of its nodes) for the tests that
// do not start their own.
const EnvRedisClusterAddrs = "SCHEDULER_TEST_REDIS_CLUSTER_ADDRS"

// RedisClusterAddrs returns seed addresses of a Redis Cluster:
// SCHEDULER_TEST_REDIS_CLUSTER_ADDRS, or the nodes of a private cluster of
// 3 masters and 3 replicas started for t (see StartRedisCluster).
func RedisClusterAddrs(t testing.TB) []string {
	t.Helper()
	if v := os.Getenv(EnvRedisClusterAddrs); v != "" {
		return strings.Split(v, ",")
	}
	return StartRedisCluster(t).Addrs()
}

// StartRedisCluster starts a private Redis Cluster of 3 masters and 3
// replicas on free loopback ports (redis-server, then redis-cli --cluster
// create), stopped (by pid) when t ends. A master that stops answering for
// a second is replaced by its replica. Without redis-server or redis-cli
// the test skips, or fails when services are required. args go to every
// node after the launcher's own ("--appendonly", "yes", say).
func StartRedisCluster(t testing.TB, args ...string) *procs.RedisCluster {
	t.Helper()
	for _, find := range []func(string) (string, error){procs.RedisBin, procs.RedisCliBin} {
		if _, err := find(""); err != nil {
			Missing(t, "redis cluster", err.Error())
		}
	}
	c, err := procs.StartRedisCluster(t.Context(), procs.RedisClusterOptions{Dir: t.TempDir(), Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
