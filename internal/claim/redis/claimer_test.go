package redis_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

func TestMain(m *testing.M) {
	// After repeated dial failures go-redis probes the node from a goroutine
	// that checks for Close only between one-second sleeps; it exits on its
	// own once the client is closed.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

func newClient(addr string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
}

// prefix returns a key prefix no other test or run shares.
func prefix() string { return "schedtest:" + claim.NewToken()[:12] + ":" }

// isolate registers cleanup of every key under p on addr.
func isolate(t testing.TB, addr, p string) {
	t.Cleanup(func() {
		ctx, cancel := testenv.CleanupContext()
		defer cancel()
		admin := newClient(addr)
		defer admin.Close()
		iter := admin.Scan(ctx, 0, p+"*", 500).Iterator()
		for iter.Next(ctx) {
			admin.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("cleanup of %s*: %v", p, err)
		}
	})
}

// opener returns claimers sharing prefix p on addr, each with its own
// client, closed when t ends.
func opener(t testing.TB, addr, p string, opts redis.Options) func(string) *redis.Claimer {
	var mu sync.Mutex
	var opened []*redis.Claimer
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range opened {
			_ = c.Close()
		}
	})
	return func(instance string) *redis.Claimer {
		o := opts
		o.Instance, o.Prefix = instance, p
		c := redis.New(newClient(addr), o)
		mu.Lock()
		opened = append(opened, c)
		mu.Unlock()
		return c
	}
}

func TestConformance(t *testing.T) {
	addr := testenv.RedisAddr(t)
	claimtest.Run(t, func(t *testing.T) func(string) claim.Claimer {
		p := prefix()
		isolate(t, addr, p)
		open := opener(t, addr, p, redis.Options{})
		return func(instance string) claim.Claimer { return open(instance) }
	}, claimtest.Options{})
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var base = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

func TestFenceGrowsAcrossARestartThatLostTheData(t *testing.T) {
	node := testenv.StartRedis(t)
	c := opener(t, node.Addr(), prefix(), redis.Options{})("replica-a")
	var last int64
	for i := range 5 {
		cl, err := c.Claim(ctxT(t), claim.Run{Job: "job.restart", At: base.Add(time.Duration(i) * time.Minute)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		last = max(last, cl.Fence)
	}
	node.Restart()
	deadline := time.Now().Add(15 * time.Second)
	for {
		// The same run again: the server forgot it, so it is granted afresh.
		cl, err := c.Claim(ctxT(t), claim.Run{Job: "job.restart", At: base}, time.Minute)
		if errors.Is(err, claim.ErrUnavailable) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // the pool is reconnecting to the restarted server
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if cl.Fence <= last || cl.Attempt != 1 {
			t.Fatalf("after restart: fence %d attempt %d, want fence > %d and attempt 1", cl.Fence, cl.Attempt, last)
		}
		return
	}
}

func TestEvictingServerIsRefused(t *testing.T) {
	evicting := testenv.StartRedis(t, "--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru")
	_, err := redis.Open(ctxT(t), newClient(evicting.Addr()), redis.Options{})
	if err == nil || !strings.Contains(err.Error(), "allkeys-lru") || !strings.Contains(err.Error(), "noeviction") {
		t.Fatalf("open on an allkeys-lru server: %v, want a refusal naming the policy and the fix", err)
	}
	allowed, err := redis.Open(ctxT(t), newClient(evicting.Addr()), redis.Options{AllowEviction: true})
	if err != nil {
		t.Fatalf("open with AllowEviction: %v", err)
	}
	_ = allowed.Close()

	safe := testenv.StartRedis(t, "--maxmemory", "10mb", "--maxmemory-policy", "noeviction")
	c, err := redis.Open(ctxT(t), newClient(safe.Addr()), redis.Options{})
	if err != nil {
		t.Fatalf("open on a noeviction server: %v", err)
	}
	_ = c.Close()
}

func TestUnreachableServerIsUnavailable(t *testing.T) {
	c := redis.New(goredis.NewClient(&goredis.Options{
		Addr: "127.0.0.1:1", DialTimeout: 200 * time.Millisecond, MaxRetries: -1, ContextTimeoutEnabled: true,
	}), redis.Options{Instance: "replica-a", Prefix: prefix()})
	defer c.Close()
	_, err := c.Claim(ctxT(t), claim.Run{Job: "job.down", At: base}, time.Minute)
	if !errors.Is(err, claim.ErrUnavailable) || errors.Is(err, claim.ErrHeld) {
		t.Fatalf("claim on an unreachable server: %v, want ErrUnavailable", err)
	}
	for name, err := range map[string]error{"ping": c.Ping(ctxT(t)), "check": c.Check(ctxT(t))} {
		if !errors.Is(err, claim.ErrUnavailable) {
			t.Fatalf("%s on an unreachable server: %v, want ErrUnavailable", name, err)
		}
	}
}

func TestPasswordNeverInErrors(t *testing.T) {
	node := testenv.StartRedis(t, "--requirepass", "right-password-1")
	c := redis.New(goredis.NewClient(&goredis.Options{
		Addr: node.Addr(), Password: "wrong-password-2", MaxRetries: -1, ContextTimeoutEnabled: true,
	}), redis.Options{Instance: "replica-a", Prefix: prefix()})
	defer c.Close()
	_, err := c.Claim(ctxT(t), claim.Run{Job: "job.auth", At: base}, time.Minute)
	if !errors.Is(err, claim.ErrUnavailable) || strings.Contains(err.Error(), "password-") {
		t.Fatalf("claim with a wrong password: %v, want ErrUnavailable without the password", err)
	}
}

func TestDoneMarkerLivesForDoneTTL(t *testing.T) {
	addr := testenv.RedisAddr(t)
	p := prefix()
	isolate(t, addr, p)
	const doneTTL = time.Hour
	c := opener(t, addr, p, redis.Options{DoneTTL: doneTTL})("replica-a")
	admin := newClient(addr)
	defer admin.Close()
	run := claim.Run{Job: "job.ttl", At: base}
	key := p + "run:" + run.ID()

	cl, err := c.Claim(ctxT(t), run, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// While running, the hash outlives the lease by DoneTTL.
	if ttl := admin.PTTL(ctxT(t), key).Val(); ttl <= doneTTL || ttl > doneTTL+time.Minute {
		t.Fatalf("running run's TTL = %v, want in (%v, %v]", ttl, doneTTL, doneTTL+time.Minute)
	}
	if err := c.Release(ctxT(t), cl, claim.Succeeded); err != nil {
		t.Fatal(err)
	}
	if ttl := admin.PTTL(ctxT(t), key).Val(); ttl <= doneTTL-time.Minute || ttl > doneTTL {
		t.Fatalf("done marker's TTL = %v, want about %v", ttl, doneTTL)
	}
}

// BenchmarkClaimRelease claims a fresh run and releases it as done: two
// round trips, against the raw SET NX references below on the same server.
func BenchmarkClaimRelease(b *testing.B) {
	addr := testenv.RedisAddr(b)
	p := prefix()
	isolate(b, addr, p)
	claimtest.BenchClaimRelease(b, opener(b, addr, p, redis.Options{})("bench"))
}

// BenchmarkRawSetNX is the floor: one bare SET NX PX per run.
func BenchmarkRawSetNX(b *testing.B) {
	addr := testenv.RedisAddr(b)
	p := prefix()
	isolate(b, addr, p)
	client := newClient(addr)
	defer client.Close()
	claimtest.Throughput(b, "ops", func(b *testing.B, i int64) {
		if err := client.SetNX(b.Context(), p+"raw:"+strconv.FormatInt(i, 10), claim.NewToken(), time.Minute).Err(); err != nil {
			b.Fatal(err)
		}
	})
}

var compareAndDelete = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// BenchmarkRawSetNXDel is the classic lock: SET NX PX, then a Lua
// compare-and-delete.
func BenchmarkRawSetNXDel(b *testing.B) {
	addr := testenv.RedisAddr(b)
	p := prefix()
	isolate(b, addr, p)
	client := newClient(addr)
	defer client.Close()
	claimtest.Throughput(b, "ops", func(b *testing.B, i int64) {
		key, token := p+"raw:"+strconv.FormatInt(i, 10), claim.NewToken()
		if err := client.SetNX(b.Context(), key, token, time.Minute).Err(); err != nil {
			b.Fatal(err)
		}
		if err := compareAndDelete.Run(b.Context(), client, []string{key}, token).Err(); err != nil {
			b.Fatal(err)
		}
	})
}

func TestHeldReplyIdentifiesTheGrant(t *testing.T) {
	addr := testenv.RedisAddr(t)
	p := prefix()
	isolate(t, addr, p)
	client := newClient(addr)
	defer client.Close()
	node := redis.NewNode(client, redis.Options{Prefix: p}, 0, 1)
	run := claim.Run{Job: "job.key", At: base}
	first := claim.NewToken()
	if r, err := node.Claim(ctxT(t), run, first, "replica-a", time.Minute); err != nil || r.Vote != redis.Granted {
		t.Fatalf("first claim: %+v, %v", r, err)
	}
	r, err := node.Claim(ctxT(t), run, claim.NewToken(), "replica-b", time.Minute)
	if err != nil || r.Vote != redis.Held || r.Holder != "replica-a" || r.HolderKey != redis.TokenKey(first) {
		t.Fatalf("second claim: %+v, %v; want held by replica-a with key %s", r, err, redis.TokenKey(first))
	}
	// A retried request (same token) is granted again, not held by itself.
	if r, err := node.Claim(ctxT(t), run, first, "replica-a", time.Minute); err != nil || r.Vote != redis.Granted || r.Attempt != 1 {
		t.Fatalf("retried claim: %+v, %v; want the same grant", r, err)
	}
}
