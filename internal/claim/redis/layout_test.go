package redis_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// TestSingleServerKeyLayoutIsUnchanged pins the key names on one server
// (and so on every Redlock node): a replica upgraded onto a namespace that
// older replicas wrote must find its runs, fences, history and restart
// marker where they are, with no hash tag.
func TestSingleServerKeyLayoutIsUnchanged(t *testing.T) {
	client, p := isolated(t)
	if err := redisnode.MarkNew(ctxT(t), client, p); err != nil {
		t.Fatal(err)
	}
	c := redis.New(newClient(client.Options().Addr), redis.Options{Instance: "replica-a", Prefix: p})
	defer c.Close()
	run := claim.Run{Job: "billing.nightly", At: base}
	cl, err := claim.ClaimOne(ctxT(t), c, run, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := claim.ReleaseOne(ctxT(t), c, cl, claim.Succeeded); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Controls().Put(ctxT(t), claim.Control{Key: "pause/billing.nightly", Value: []byte("x"), Version: 1}); err != nil {
		t.Fatal(err)
	}
	keys, err := client.Keys(ctxT(t), p+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	want := []string{
		p + "controls",
		p + "fence:billing.nightly",
		p + "jobs",
		p + "run:billing.nightly@2026-01-02T03:04:00Z",
		p + "runs:billing.nightly",
		p + "server",
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys on one server:\n%s\nwant\n%s", strings.Join(keys, "\n"), strings.Join(want, "\n"))
	}
	for key, typ := range map[string]string{want[0]: "hash", want[1]: "string", want[2]: "set", want[3]: "hash",
		want[4]: "zset", want[5]: "hash"} {
		if got := client.Type(ctxT(t), key).Val(); got != typ {
			t.Errorf("%s is a %s, want a %s", key, got, typ)
		}
	}
}
