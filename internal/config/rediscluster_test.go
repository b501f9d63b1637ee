package config

import (
	"slices"
	"strings"
	"testing"
)

func TestRedisClusterBlock(t *testing.T) {
	rc := "claimer:\n  kind: redis\n  redis:\n    password: " + secret + "\n"
	for _, tt := range []struct{ name, yaml, key, value, msg string }{
		{"ClusterWithoutSeeds", rc + "    cluster: true\n", "claimer.redis.addrs", "", "missing (required when claimer.redis.cluster is true"},
		{"AddrsWithoutCluster", rc + "    addr: a:1\n    addrs: [b:1, c:1]\n", "claimer.redis.addrs", "b:1,c:1", "set claimer.redis.cluster: true"},
		{"SeedIsURL", rc + "    cluster: true\n    addrs: ['redis://u:" + secret + "@h:6379']\n", "claimer.redis.addrs[0]", "redis://u:xxxxx@h:6379", "not a URL"},
		{"DuplicateSeed", rc + "    cluster: true\n    addrs: [a:1, b:1, A:1]\n", "claimer.redis.addrs[2]", "A:1", "duplicate of addrs[0]"},
		{"ClusterWithDB", rc + "    cluster: true\n    addrs: [a:1]\n    db: 2\n", "claimer.redis.db", "2", "database 0 only"},
		{"ClusterPrefixWithBrace", rc + "    cluster: true\n    addrs: [a:1]\n    prefix: 'app:{x}:'\n", "claimer.redis.prefix", "app:{x}:", "must not hold a brace"},
	} {
		t.Run(tt.name, func(t *testing.T) { wantProblem(t, tt.yaml, tt.key, tt.value, tt.msg) })
	}

	t.Run("SeedsFromAddrAndAddrs", func(t *testing.T) {
		c := mustLoad(t, rc+"    cluster: true\n    addr: a:1\n    addrs: [b:1, a:1, c:1]\n")
		r := c.Claimer.Redis
		if got := r.Seeds(); !slices.Equal(got, []string{"a:1", "b:1", "c:1"}) || !r.Cluster || r.Prefix != "scheduler:" {
			t.Errorf("seeds %v of %+v", got, r)
		}
		if s := c.Redacted(); strings.Contains(s, secret) || !strings.Contains(s, "cluster: true") {
			t.Errorf("redacted config leaks the password or drops cluster:\n%s", s)
		}
	})

	t.Run("SingleServerUnchanged", func(t *testing.T) {
		c := mustLoad(t, rc+"    addr: a:1\n")
		if r := c.Claimer.Redis; r.Cluster || !slices.Equal(r.Seeds(), []string{"a:1"}) {
			t.Errorf("single server block = %+v", r)
		}
	})
}
