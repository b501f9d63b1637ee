package redis_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// onCluster prepares namespaces on the Redis Cluster whose seed nodes are
// seeds, through the claimer's cluster client (claimer.redis.cluster).
func onCluster(seeds []string) backends.Options {
	return backends.Options{Servers: seeds[:1], Tune: func(c *config.Claimer) {
		c.Redis.Cluster, c.Redis.Addrs = true, seeds[1:]
	}}
}

// TestCluster runs the suite on a cluster of 3 masters and 3 replicas, a
// key prefix per case, one cluster client per claimer; then checks what
// only a cluster shows, on the same cluster.
func TestCluster(t *testing.T) {
	seeds := testenv.RedisClusterAddrs(t)
	t.Run("Conformance", func(t *testing.T) {
		claimtest.Run(t, backends.Factory("redis", onCluster(seeds)), claimtest.Options{Pages: true, StartHold: true})
	})
	t.Run("KeysShareTheirJobsHashTag", func(t *testing.T) {
		t.Parallel()
		keysShareTheirJobsHashTag(t, seeds)
	})

	// A plain client pointed at a cluster node (a master, a replica) is
	// refused at start-up, with the node's address, rather than
	// redirected on most claims.
	t.Run("PlainClientOnAClusterNodeIsRefused", func(t *testing.T) {
		t.Parallel()
		for _, addr := range []string{seeds[0], seeds[len(seeds)-1]} {
			client := newClient(addr)
			_, err := redis.Open(ctxT(t), client, redis.Options{Instance: "replica-a"})
			_ = client.Close()
			if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "cluster_enabled:1") ||
				errors.Is(err, claim.ErrUnavailable) {
				t.Fatalf("open with a plain client on cluster node %s: %v, want a refusal naming the node", addr, err)
			}
		}
	})
}

// keysShareTheirJobsHashTag claims and finishes runs of many jobs in one
// batch on a cluster: every key a job writes carries its bucket's hash tag
// (so each script stays in one slot), the buckets spread over every
// master, and the history finds every job again.
func keysShareTheirJobsHashTag(t *testing.T, seeds []string) {
	admin := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: seeds})
	p := testenv.RandomPrefix(t.Name())
	t.Cleanup(func() {
		ctx, cancel := testenv.CleanupContext()
		defer cancel()
		_ = redisnode.DropPrefix(ctx, admin, p)
		_ = admin.Close()
	})
	if err := redisnode.MarkNew(ctxT(t), admin, p); err != nil {
		t.Fatal(err)
	}
	c := redis.New(goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: seeds, ContextTimeoutEnabled: true}),
		redis.Options{Instance: "replica-a", Prefix: p})
	defer c.Close()
	layout := redisnode.New(admin, redisnode.Options{Prefix: p}, 0, 1)
	var runs []claim.Run
	for i := range 30 {
		runs = append(runs, claim.Run{Job: "job." + strconv.Itoa(i), At: base})
	}
	cls, errs := c.Claim(ctxT(t), runs, time.Minute)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %s: %v", runs[i].ID(), err)
		}
	}
	for i, err := range c.Release(ctxT(t), cls, slices.Repeat([]claim.Status{claim.Succeeded}, len(cls))) {
		if err != nil {
			t.Fatalf("release %s: %v", runs[i].ID(), err)
		}
	}
	masters := map[string]bool{}
	for _, run := range runs {
		tag := p + "{" + strconv.Itoa(layout.Bucket(run.Job)) + "}"
		for _, key := range []string{tag + "run:" + run.ID(), tag + "fence:" + run.Job, tag + "runs:" + run.Job,
			tag + "jobs", tag + "server"} {
			if n := admin.Exists(ctxT(t), key).Val(); n != 1 {
				t.Fatalf("no key %s", key)
			}
		}
		m, err := admin.MasterForKey(ctxT(t), tag)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Errorf("30 jobs' buckets on %d masters, want all 3", len(masters))
	}
	recs, err := c.History(ctxT(t), "", 0)
	if err != nil || len(recs) != len(runs) {
		t.Fatalf("history of every job: %d records, %v; want %d", len(recs), err, len(runs))
	}
}

// A cluster client (claimer.redis.cluster: true) pointed at a plain
// server is refused at start-up naming the server and the setting to
// change, not only the server's own "cluster support disabled".
func TestAClusterClientOnAPlainServerIsRefusedNamingTheSetting(t *testing.T) {
	addr := testenv.RedisAddr(t)
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true})
	defer client.Close()
	_, err := redis.Open(ctxT(t), client, redis.Options{Instance: "replica-a", Prefix: testenv.RandomPrefix(t.Name())})
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "claimer.redis.cluster: false") {
		t.Fatalf("open with a cluster client on the plain server %s: %v, want a refusal naming it and claimer.redis.cluster", addr, err)
	}
}
