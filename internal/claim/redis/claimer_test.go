package redis_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/faultproxy"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.IgnoreRedisDialProbe) }

func newClient(addr string) *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
}

// isolated returns a client of the test server and a key prefix whose keys
// are deleted when tb ends.
func isolated(tb testing.TB) (*goredis.Client, string) {
	addr := testenv.RedisAddr(tb)
	client := newClient(addr)
	tb.Cleanup(func() { _ = client.Close() })
	return client, testenv.RedisPrefix(tb, addr)
}

func TestConformance(t *testing.T) {
	claimtest.Run(t, backends.Factory("redis", backends.Options{}), claimtest.Options{Pages: true, StartHold: true})
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var base = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// TestRestartThatLostTheDataHoldsEveryRunForALease restarts a server
// without persistence under a live claim. Replicas that had claimed on it
// before find the epoch marker gone: every run is held for a lease from
// then, the old holder's renewal is refused meanwhile, and afterwards the
// forgotten run is granted afresh with a fence above every earlier one.
func TestRestartThatLostTheDataHoldsEveryRunForALease(t *testing.T) {
	node := testenv.StartRedis(t)
	be := backends.Prepare(t, "redis", backends.Options{Servers: []string{node.Addr()}})
	a, b := be.Open("replica-a"), be.Open("replica-b")
	run := claim.Run{Job: "job.restart", At: base}
	var last int64
	var live *claim.Claim
	for i := range 5 {
		cl, err := claim.ClaimOne(ctxT(t), a, claim.Run{Job: run.Job, At: base.Add(time.Duration(i) * time.Minute)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		last = max(last, cl.Fence)
		if i == 0 {
			live = cl
		}
	}
	if _, err := claim.ClaimOne(ctxT(t), b, run, time.Minute); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("claim of a live run before the restart: %v, want ErrHeld", err)
	}

	node.Restart()
	const lease = 500 * time.Millisecond
	deadline := time.Now().Add(15 * time.Second)
	var first time.Time // when the first claim the restarted server answered was sent
	for {
		sent := time.Now()
		cl, err := claim.ClaimOne(ctxT(t), b, run, lease)
		switch {
		case errors.Is(err, claim.ErrUnavailable) && first.IsZero() && time.Now().Before(deadline):
			time.Sleep(20 * time.Millisecond) // the pool is reconnecting to the restarted server
			continue
		case errors.Is(err, claim.ErrHeld) && time.Now().Before(deadline):
			// Held by the guard, not by a replica: the error says the
			// server lost its data and until when it holds, a lease on.
			var loss *claim.DataLossError
			if !errors.As(err, &loss) || !strings.Contains(loss.Error(), node.Addr()) {
				t.Fatalf("claim held on the restarted server: %v, want a claim.DataLossError naming %s", err, node.Addr())
			}
			if until := time.Until(loss.Until); until > lease+time.Second {
				t.Fatalf("guard holds until %v from now, want within the %v lease (plus clock slack)", until, lease)
			}
			if first.IsZero() {
				first = sent
				// The old holder is told at once, and a batch (the runner's
				// way to claim) is held too: asked for a minute's lease,
				// within a minute of the guard's start.
				if err := a.Renew(ctxT(t), live, time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
					t.Fatalf("renewal of a claim the restart erased: %v, want ErrLeaseLost", err)
				}
				_, errs := a.Claim(ctxT(t), []claim.Run{run, {Job: run.Job, At: base.Add(time.Hour)}}, time.Minute)
				for i, err := range errs {
					if !errors.Is(err, claim.ErrHeld) || !errors.As(err, new(*claim.DataLossError)) {
						t.Fatalf("batch claim %d on the restarted server within the guard: %v, want ErrHeld for data loss", i, err)
					}
				}
			}
			time.Sleep(20 * time.Millisecond) // polling a server-side lease; no event to wait on
			continue
		case err != nil:
			t.Fatal(err)
		}
		if first.IsZero() {
			t.Fatalf("the restarted server granted %s at once; want it held for a lease", run.ID())
		}
		// The guard's lease began when its first claim ran, after it was
		// sent; this grant ran at least a lease after that.
		if d := time.Since(first); d < lease {
			t.Fatalf("granted %v after the first claim on the restarted server, want at least the %v lease", d, lease)
		}
		if cl.Fence <= last || cl.Attempt != 1 {
			t.Fatalf("after restart: fence %d attempt %d, want fence > %d and attempt 1", cl.Fence, cl.Attempt, last)
		}
		return
	}
}

// TestRestartKeepsTheRunsALiveReplicaFinished: two runs finish just before
// the server restarts empty, while replica b stands by for both. The one
// whose finishing replica is still up stays done: that replica sees the
// epoch marker change and writes its done marker back within the guard.
// The one whose finishing replica is gone is granted to b after the guard,
// the gap the design notes (doc.go) still admit.
func TestRestartKeepsTheRunsALiveReplicaFinished(t *testing.T) {
	node := testenv.StartRedis(t)
	be := backends.Prepare(t, "redis", backends.Options{Servers: []string{node.Addr()}})
	a, gone, b := be.Open("replica-a"), be.Open("replica-gone"), be.Open("replica-b")
	// The guard lasts a lease and the watch looks every lease/4: a 3s
	// lease leaves the watch 2s of slack on a loaded machine.
	const lease = 3 * time.Second
	kept, lost := claim.Run{Job: "job.kept", At: base}, claim.Run{Job: "job.lost", At: base}
	for _, x := range []struct {
		holder claim.Claimer
		run    claim.Run
	}{{a, kept}, {gone, lost}} {
		cl, err := claim.ClaimOne(ctxT(t), x.holder, x.run, lease)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := claim.ClaimOne(ctxT(t), b, x.run, lease); !errors.Is(err, claim.ErrHeld) {
			t.Fatalf("b's claim of %s while it runs: %v, want ErrHeld", x.run.ID(), err)
		}
		if err := claim.ReleaseOne(ctxT(t), x.holder, cl, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
	}
	_ = gone.Close()

	node.Restart()
	// Each run is polled until the guard no longer holds it: the guard
	// may end between two claims.
	settled := func(run claim.Run) error {
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err := claim.ClaimOne(ctxT(t), b, run, lease)
			waiting := errors.Is(err, claim.ErrUnavailable) || errors.As(err, new(*claim.DataLossError))
			if !waiting {
				return err
			}
			if time.Now().After(deadline) {
				t.Fatalf("still waiting for %s after the restart: %v", run.ID(), err)
			}
			time.Sleep(20 * time.Millisecond) // polling a server-side guard; no event to wait on
		}
	}
	if err := settled(kept); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("claim of the run a live replica finished before the restart: %v, want ErrDone", err)
	}
	if err := settled(lost); err != nil {
		t.Fatalf("claim of the run whose finishing replica is gone, after the guard: %v, want it granted (the documented gap)", err)
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
	}), redis.Options{Instance: "replica-a", Prefix: testenv.RandomPrefix(t.Name())})
	defer c.Close()
	_, err := claim.ClaimOne(ctxT(t), c, claim.Run{Job: "job.down", At: base}, time.Minute)
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
	}), redis.Options{Instance: "replica-a", Prefix: testenv.RandomPrefix(t.Name())})
	defer c.Close()
	_, err := claim.ClaimOne(ctxT(t), c, claim.Run{Job: "job.auth", At: base}, time.Minute)
	if !errors.Is(err, claim.ErrUnavailable) || strings.Contains(err.Error(), "password-") {
		t.Fatalf("claim with a wrong password: %v, want ErrUnavailable without the password", err)
	}
}

func TestDoneMarkerLivesForDoneTTL(t *testing.T) {
	const doneTTL = time.Hour
	ns := backends.Prepare(t, "redis", backends.Options{Tune: func(c *config.Claimer) { c.Redis.DoneTTL = config.Duration(doneTTL) }})
	c := ns.Open("replica-a")
	admin := newClient(ns.Servers()[0])
	defer admin.Close()
	run := claim.Run{Job: "job.ttl", At: base}
	key := ns.Config.Redis.Prefix + "run:" + run.ID()

	cl, err := claim.ClaimOne(ctxT(t), c, run, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// While running, the hash outlives the lease by DoneTTL.
	if ttl := admin.PTTL(ctxT(t), key).Val(); ttl <= doneTTL || ttl > doneTTL+time.Minute {
		t.Fatalf("running run's TTL = %v, want in (%v, %v]", ttl, doneTTL, doneTTL+time.Minute)
	}
	if err := claim.ReleaseOne(ctxT(t), c, cl, claim.Succeeded); err != nil {
		t.Fatal(err)
	}
	if ttl := admin.PTTL(ctxT(t), key).Val(); ttl <= doneTTL-time.Minute || ttl > doneTTL {
		t.Fatalf("done marker's TTL = %v, want about %v", ttl, doneTTL)
	}
}

// BenchmarkClaimRelease claims a fresh run and releases it as done: two
// round trips, against the raw SET NX references below on the same server.
func BenchmarkClaimRelease(b *testing.B) {
	claimtest.BenchClaimRelease(b, backends.Open(b, "redis")("bench"))
}

// BenchmarkRawSetNX is the floor: one bare SET NX PX per run.
func BenchmarkRawSetNX(b *testing.B) {
	client, p := isolated(b)
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
	client, p := isolated(b)
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

// BenchmarkControlsTick is a replica's read of the controls each tick
// (control.Store.Snapshot) with one schedule entry for each of 10,000
// jobs in the register: nine ticks in ten read no schedule entries
// (tick); the others read them too (with-schedules) in one walk of the
// controls hash, against one walk per kind (walk-per-kind: the same read
// through a register that is not a claim.PrefixLister).
func BenchmarkControlsTick(b *testing.B) {
	reg := backends.Open(b, "redis")("bench").Controls
	st := control.New(reg, nil)
	for i := range 10_000 {
		if _, err := st.SetSchedule(b.Context(), control.ScheduleEntry{Job: "job-" + strconv.Itoa(i),
			Fingerprint: "0123456789abcdef", Spec: "*/5 * * * *", Timezone: "Europe/Amsterdam", By: "bench"}); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name      string
		st        *control.Store
		schedules bool
	}{
		{"tick", st, false},
		{"with-schedules", st, true},
		{"walk-per-kind", control.New(struct{ claim.Controls }{reg}, nil), true},
	} {
		b.Run(c.name, func(b *testing.B) {
			want := 0
			if c.schedules {
				want = 10_000
			}
			for b.Loop() {
				snap, err := c.st.Snapshot(b.Context(), c.schedules)
				if err != nil || len(snap.Schedules) != want {
					b.Fatalf("snapshot: %d schedule entries, %v; want %d", len(snap.Schedules), err, want)
				}
			}
		})
	}
}

// TestOneBadRunInABatchFailsAlone: a batch's runs share a script call, and
// Redis keeps what a script wrote before it failed. A run whose key holds
// something else (here a string) must fail alone: the runs beside it are
// answered as granted, not granted and answered as errors (ghosts held by
// nobody for a lease).
func TestOneBadRunInABatchFailsAlone(t *testing.T) {
	client, prefix := isolated(t)
	if err := redisnode.MarkNew(ctxT(t), client, prefix); err != nil {
		t.Fatal(err)
	}
	addr := client.Options().Addr
	a, err := redis.Open(ctxT(t), newClient(addr), redis.Options{Instance: "replica-a", Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	before, bad, after := claim.Run{Job: "job.good", At: base}, claim.Run{Job: "job.bad", At: base}, claim.Run{Job: "job.good", At: base.Add(time.Minute)}
	if err := client.Set(ctxT(t), prefix+"run:"+bad.ID(), "not a run", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cls, errs := a.Claim(ctxT(t), []claim.Run{before, bad, after}, time.Minute)
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "WRONGTYPE") {
		t.Fatalf("the bad run: %v, want its WRONGTYPE error", errs[1])
	}
	for _, k := range []int{0, 2} {
		if errs[k] != nil || cls[k] == nil {
			t.Fatalf("run %d beside the bad one: %v, want granted", k, errs[k])
		}
	}
	rerrs := a.Release(ctxT(t), []*claim.Claim{cls[0], {Run: bad, Token: "t", Holder: "replica-a", Attempt: 1, Fence: 1}, cls[2]},
		[]claim.Status{claim.Succeeded, claim.Succeeded, claim.Succeeded})
	if rerrs[0] != nil || rerrs[2] != nil || rerrs[1] == nil {
		t.Fatalf("releases %v: want the two good ones released and the bad one failed", rerrs)
	}
}

// lossyPair is two claimers of one namespace: "lossy" through a fault
// proxy, "other" direct. Neither retries: go-redis sends a call again
// after a reset (three times by default), and a retried claim with its
// token is granted again; here the retries are used up, or a timeout
// ended the call.
func lossyPair(t *testing.T) (*faultproxy.Proxy, *redis.Claimer, *redis.Claimer) {
	client, prefix := isolated(t)
	if err := redisnode.MarkNew(ctxT(t), client, prefix); err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(client.Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	open := func(instance, addr string) *redis.Claimer {
		c, err := redis.Open(ctxT(t), goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1}),
			redis.Options{Instance: instance, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	return proxy, open("lossy", proxy.Addr()), open("other", client.Options().Addr)
}

// TestAClaimWhoseReplyWasLostLeavesNoGhost: the script granted, the reply
// never came back (a timeout, a dropped connection). The caller hears
// the server was unavailable and runs nothing; the grant is undone, so
// another replica gets the run at once rather than after a whole lease
// held by nobody.
func TestAClaimWhoseReplyWasLostLeavesNoGhost(t *testing.T) {
	// The proxy drops the connection in place of the claim's reply: the
	// scripts ran, the caller hears a reset.
	proxy, lossy, other := lossyPair(t)
	fresh, again := claim.Run{Job: "job.lost-reply", At: base}, claim.Run{Job: "job.lost-reply", At: base.Add(time.Minute)}
	// The second run is a takeover: its first attempt was handed back.
	first, err := claim.ClaimOne(ctxT(t), other, again, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := claim.ReleaseOne(ctxT(t), other, first, claim.Interrupted); err != nil {
		t.Fatal(err)
	}

	proxy.DropReplies(1, func(b []byte) bool { return bytes.Contains(b, []byte("granted")) })
	cls, errs := lossy.Claim(ctxT(t), []claim.Run{fresh, again}, time.Minute)
	for k, err := range errs {
		if !errors.Is(err, claim.ErrUnavailable) || cls[k] != nil {
			t.Fatalf("claim %d with its reply lost: %v, %v; want ErrUnavailable and no claim", k, cls[k], err)
		}
	}
	if s := proxy.Stats(); s.Dropped != 1 {
		t.Fatalf("proxy dropped %d replies, want the claim's (%+v)", s.Dropped, s)
	}
	for _, run := range []claim.Run{fresh, again} {
		// The undo goes on its own goroutine: within moments, not the
		// lease's minute.
		cl, err := claimtest.ClaimWhenFreed(t, other, run, time.Minute)
		if err != nil {
			t.Fatalf("%s after a claim whose reply was lost: %v, want granted within moments", run.ID(), err)
		}
		want := 1
		if run == again {
			want = 2
		}
		if cl.Attempt != want {
			t.Errorf("%s granted as attempt %d, want %d: the lost grant's attempt is given back", run.ID(), cl.Attempt, want)
		}
	}
}

// TestAClaimWhoseReplyAndUndoWereLostIsGrantedToItsNextTry: the script
// granted, the reply was lost, and so was the undo (a stalled server
// answers neither). The grant is this replica's: its next claim of the
// run is granted it at once, where it would be held off by its own ghost
// for the lease; another replica is still held off.
func TestAClaimWhoseReplyAndUndoWereLostIsGrantedToItsNextTry(t *testing.T) {
	proxy, lossy, other := lossyPair(t)
	run := claim.Run{Job: "job.lost-undo", At: base}
	// The claim carries its holder's name; the undo does not.
	proxy.DropRequests(1, func(b []byte) bool { return bytes.Contains(b, []byte(run.ID())) && !bytes.Contains(b, []byte("lossy")) })
	proxy.DropReplies(1, func(b []byte) bool { return bytes.Contains(b, []byte("granted")) })
	if _, err := claim.ClaimOne(ctxT(t), lossy, run, time.Minute); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("claim with its reply lost: %v, want ErrUnavailable", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for proxy.Stats().Dropped < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("proxy dropped %+v: want the claim's reply and the undo", proxy.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	claimtest.NextTryTakesItsLostGrant(t, lossy, other, run)
}

// TestClaimsAStalledServerAppliedLateAreGrantedToTheirNextTry: the server
// stops (SIGSTOP) under a claim of many runs; the claim and its undo both
// time out, and the server applies what they sent when it wakes, in
// whatever order. Every run is granted to the replica's next claim, at
// attempt 1: none is held by a grant nobody knows until its lease ends
// and then run as attempt 2 (an outside review: 600 of 1,465 runs after
// a 15s stall).
func TestClaimsAStalledServerAppliedLateAreGrantedToTheirNextTry(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	const prefix = "stall:"
	if err := redisnode.MarkNew(ctxT(t), client, prefix); err != nil {
		t.Fatal(err)
	}
	a, err := redis.Open(ctxT(t), client, redis.Options{Instance: "a", Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	for round := range 3 {
		runs := make([]claim.Run, 60)
		for i := range runs {
			runs[i] = claim.Run{Job: "job.stall." + strconv.Itoa(i%3), At: base.Add(time.Duration(100*round+i) * time.Minute)}
		}
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		// Three callers at once, as the runner's due runs come.
		done := make(chan struct{})
		for k := range 3 {
			go func() {
				defer func() { done <- struct{}{} }()
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				_, errs := a.Claim(ctx, runs[20*k:20*k+20], time.Minute)
				for _, err := range errs {
					if err == nil {
						t.Errorf("a claim on a stopped server was granted")
					}
				}
			}()
		}
		for range 3 {
			<-done
		}
		time.Sleep(1200 * time.Millisecond) // past the undo's second: it timed out too
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
		cls, errs := a.Claim(ctxT(t), runs, time.Minute)
		held := 0
		for k, err := range errs {
			switch {
			case errors.Is(err, claim.ErrHeld):
				held++
			case err != nil:
				t.Fatalf("round %d, %s after the stall: %v", round, runs[k].ID(), err)
			case cls[k].Attempt != 1:
				t.Fatalf("round %d, %s granted as attempt %d, want 1", round, runs[k].ID(), cls[k].Attempt)
			}
		}
		if held > 0 {
			t.Fatalf("round %d: %d of %d runs held by the grants of claims the stopped server applied late", round, held, len(runs))
		}
	}
}

// TestALeaseThatLapsedWhileTheServerWasStoppedIsNotTakenOverAtOnce: a
// SIGSTOP longer than the lease (claimtest.LapsedInAStallIsNotTakenOver).
func TestALeaseThatLapsedWhileTheServerWasStoppedIsNotTakenOverAtOnce(t *testing.T) {
	holder, standby, stop, cont, _ := stoppable(t, "lapse:")
	claimtest.LapsedInAStallIsNotTakenOver(t, holder, standby, stop, cont, 2*time.Second)
}

// TestAServerStoppedBrieflyAgainAndAgainHoldsTakeoversOnlyAWhile: brief
// SIGSTOPs every fraction of a lease, answers between them
// (claimtest.ChronicStallsEndTheHold).
func TestAServerStoppedBrieflyAgainAndAgainHoldsTakeoversOnlyAWhile(t *testing.T) {
	holder, standby, stop, cont, _ := stoppable(t, "chronic:")
	claimtest.ChronicStallsEndTheHold(t, holder, standby, stop, cont, time.Second)
}

// stoppable opens a holder and a standby on a private server, srv, and
// returns functions that stop and continue it.
func stoppable(t *testing.T, prefix string) (holder, standby *redis.Claimer, stop, cont func(), srv *testenv.Redis) {
	srv = testenv.StartRedis(t)
	open := func(instance string) *redis.Claimer {
		client := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
		if instance == "holder" {
			if err := redisnode.MarkNew(ctxT(t), client, prefix); err != nil {
				t.Fatal(err)
			}
		}
		c, err := redis.Open(ctxT(t), client, redis.Options{Instance: instance, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(); _ = client.Close() })
		return c
	}
	return open("holder"), open("standby"), func() {
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
		}, func() {
			if err := srv.Resume(); err != nil {
				t.Fatal(err)
			}
		}, srv
}

// TestABidThatWaitedOutAPausedServerDoesNotTakeOverWhenItRuns: CLIENT
// PAUSE WRITE, which the review saw run 2 and 3 runs twice, with a
// standby that saw nothing unanswered before its bid
// (claimtest.ABidThatWaitedInAStallIsHeld).
func TestABidThatWaitedOutAPausedServerDoesNotTakeOverWhenItRuns(t *testing.T) {
	holder, standby, _, _, srv := stoppable(t, "waited:")
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	claimtest.ABidThatWaitedInAStallIsHeld(t, holder, standby, func() {
		if err := admin.Do(ctxT(t), "CLIENT", "PAUSE", 60000, "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
	}, func() {
		if err := admin.Do(ctxT(t), "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Fatal(err)
		}
	}, 2*time.Second, 0)
}

// TestRefusedWritesHoldTakeoversUntilWritesLand: the server out of
// memory (maxmemory under noeviction: every write refused with OOM) past
// the lease (claimtest.RefusedWritesHoldTakeovers).
func TestRefusedWritesHoldTakeoversUntilWritesLand(t *testing.T) {
	holder, standby, _, _, srv := stoppable(t, "refused:")
	claimtest.RefusedWritesHoldTakeovers(t, holder, standby, srv.RefuseWrites, time.Second)
}

// TestABidSentIntoAStoppedServerDoesNotTakeOverWhenItRuns: the same
// across a SIGSTOP.
func TestABidSentIntoAStoppedServerDoesNotTakeOverWhenItRuns(t *testing.T) {
	holder, standby, stop, cont, _ := stoppable(t, "waited.stop:")
	claimtest.ABidThatWaitedInAStallIsHeld(t, holder, standby, stop, cont, 2*time.Second, 0)
}

// TestABatchBidSentIntoAStoppedServerDoesNotTakeOverWhenItRuns: the same
// bid in a batch (claimtest.ABatchBidThatWaitedInAStallIsHeld).
func TestABatchBidSentIntoAStoppedServerDoesNotTakeOverWhenItRuns(t *testing.T) {
	holder, standby, stop, cont, _ := stoppable(t, "waited.batch:")
	claimtest.ABatchBidThatWaitedInAStallIsHeld(t, holder, standby, stop, cont, 2*time.Second, 0)
}
