package redis_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/faultproxy"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// answered retries call while the server is unreachable: clients
// reconnect to a restarted server on first use.
func answered[T any](t *testing.T, call func() (T, error)) (T, error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := call()
		if !errors.Is(err, claim.ErrUnavailable) || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(20 * time.Millisecond) // waiting for the server to accept connections; no event to wait on
	}
}

// heldForLoss fails t unless err is ErrHeld carrying a claim.DataLossError.
func heldForLoss(t *testing.T, err error, what string) *claim.DataLossError {
	t.Helper()
	var loss *claim.DataLossError
	if !errors.Is(err, claim.ErrHeld) || !errors.As(err, &loss) {
		t.Fatalf("%s: %v, want ErrHeld for data loss (claim.DataLossError)", what, err)
	}
	return loss
}

// grantAfterGuard polls c's claim of run until it is granted, while the
// restart guard or an expiring lease holds it.
func grantAfterGuard(t *testing.T, c claim.Claimer, run claim.Run, lease time.Duration) *claim.Claim {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cl, err := claim.ClaimOne(ctxT(t), c, run, lease)
		if err == nil {
			return cl
		}
		if !errors.Is(err, claim.ErrHeld) && !errors.Is(err, claim.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("claim %s after the restart: %v", run.ID(), err)
		}
		time.Sleep(20 * time.Millisecond) // polling a server-side guard; no event to wait on
	}
}

// doneAfterGuard polls c's claim of run until it is found done, failing t
// if it is anything but held (by the restart guard) meanwhile.
func doneAfterGuard(t *testing.T, c claim.Claimer, run claim.Run, lease time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := claim.ClaimOne(ctxT(t), c, run, lease)
		if errors.Is(err, claim.ErrDone) {
			return
		}
		if !errors.Is(err, claim.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("%s: %v, want ErrHeld until ErrDone", what, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a server-side guard; no event to wait on
	}
}

// upFor waits until the server behind client reports an uptime of at
// least secs seconds (answering, for a server just restarted).
func upFor(t *testing.T, client *goredis.Client, secs int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		up, err := client.Info(ctxT(t), "server").Result()
		if err == nil {
			_, v, _ := strings.Cut(up, "uptime_in_seconds:")
			v, _, _ = strings.Cut(v, "\r")
			if n, err := strconv.Atoi(v); err == nil && n >= secs {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not up for %ds after 30s: %v", secs, err)
		}
		time.Sleep(100 * time.Millisecond) // waiting on the server's clock; no event to wait on
	}
}

// restartKind is one way a Redis server really restarts: what the test
// does at the moment whose state the restarted server comes back with,
// and how it restarts.
type restartKind struct {
	name string
	args []string
	mark func(t *testing.T, node *testenv.Redis) func()
}

var restartKinds = []restartKind{
	{name: "Empty", mark: func(*testing.T, *testenv.Redis) func() { return nil }},
	{name: "FromAnRDBSnapshot", mark: func(t *testing.T, node *testenv.Redis) func() {
		admin := newClient(node.Addr())
		defer admin.Close()
		if err := admin.Save(ctxT(t)).Err(); err != nil {
			t.Fatal(err)
		}
		return nil
	}},
	// appendfsync everysec loses up to a second of acknowledged writes
	// when the host goes down: cut the AOF back to the mark, as a crash
	// before the fsync would.
	{name: "FromAnAOFThatLostItsLastSecond", args: []string{"--appendonly", "yes", "--appendfsync", "everysec"},
		mark: func(t *testing.T, node *testenv.Redis) func() {
			files, err := filepath.Glob(filepath.Join(node.Dir(), "appendonlydir", "*.incr.aof"))
			if err != nil || len(files) != 1 {
				t.Fatalf("AOF files %v (%v), want one incr file", files, err)
			}
			st, err := os.Stat(files[0])
			if err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := os.Truncate(files[0], st.Size()); err != nil {
					t.Fatal(err)
				}
			}
		}},
}

// TestRestartHoldsRunsUntilOldHoldersStandDown restarts the server in
// each way Redis restarts: empty, or with some of its keys (an RDB
// snapshot, an AOF that lost its tail), so that the namespace's marker
// survives while later grants, renewals and releases are gone. In every
// case the claim that finds the restart is held (claim.DataLossError),
// the holder from before is refused its renewal, the run is granted again
// only after that holder's trust window, with a higher fence, and the runs
// a live replica finished stay done, including one the snapshot still
// shows running under that replica's token.
func TestRestartHoldsRunsUntilOldHoldersStandDown(t *testing.T) {
	testenv.WallClock(t)
	for _, kind := range restartKinds {
		t.Run(kind.name, func(t *testing.T) {
			node := testenv.StartRedis(t, kind.args...)
			be := backends.Prepare(t, "redis", backends.Options{Servers: []string{node.Addr()}})
			holder, finisher, standby := be.Open("holder"), be.Open("finisher"), be.Open("standby")
			const lease = time.Second
			live := claim.Run{Job: "job.live", At: base}
			early, late := claim.Run{Job: "job.early", At: base}, claim.Run{Job: "job.late", At: base}
			var last int64
			claimed := func(c claim.Claimer, run claim.Run) *claim.Claim {
				cl, err := claim.ClaimOne(ctxT(t), c, run, lease)
				if err != nil {
					t.Fatal(err)
				}
				last = max(last, cl.Fence)
				return cl
			}
			if err := claim.ReleaseOne(ctxT(t), finisher, claimed(finisher, early), claim.Succeeded); err != nil {
				t.Fatal(err)
			}
			held, lateClaim := claimed(holder, live), claimed(finisher, late)
			if _, err := claim.ClaimOne(ctxT(t), standby, live, lease); !errors.Is(err, claim.ErrHeld) {
				t.Fatalf("standby's claim of the live run: %v, want ErrHeld", err)
			}
			restore := kind.mark(t, node)
			// After the mark: a release and a renewal, acknowledged and
			// then lost by every restart but the AOF's.
			if err := claim.ReleaseOne(ctxT(t), finisher, lateClaim, claim.Succeeded); err != nil {
				t.Fatal(err)
			}
			time.Sleep(lease / 2) // the renewal cadence: this renewal extends the holder's trust past its grant's lease
			if err := holder.Renew(ctxT(t), held, lease); err != nil {
				t.Fatal(err)
			}
			trusted := held.TrustedUntil(0)

			node.Stop()
			if restore != nil {
				restore()
			}
			node.Start()

			_, err := answered(t, func() (*claim.Claim, error) { return claim.ClaimOne(ctxT(t), standby, live, lease) })
			heldForLoss(t, err, "first claim of the live run after the restart")
			err = holder.Renew(ctxT(t), held, lease)
			if !errors.Is(err, claim.ErrLeaseLost) {
				t.Fatalf("renewal of a claim granted before the restart: %v, want ErrLeaseLost", err)
			}
			cl := grantAfterGuard(t, standby, live, lease)
			if left := time.Until(trusted); left > 0 {
				t.Fatalf("live run granted again %v before its old holder's trust window closed", left)
			}
			if cl.Fence <= last {
				t.Fatalf("fence %d after the restart, want above %d", cl.Fence, last)
			}
			for _, run := range []claim.Run{early, late} {
				if _, err := claim.ClaimOne(ctxT(t), standby, run, lease); !errors.Is(err, claim.ErrDone) {
					t.Fatalf("claim of %s, finished by a live replica before the restart: %v, want ErrDone", run.ID(), err)
				}
			}
		})
	}
}

// TestNewcomerAfterARestartIsHeld: after a restart that lost the data,
// the first to claim is a replica that never claimed on the server
// before. Whether the server lost its data does not depend on what that
// replica remembers: it is held, and the old holder is refused.
func TestNewcomerAfterARestartIsHeld(t *testing.T) {
	node := testenv.StartRedis(t)
	be := backends.Prepare(t, "redis", backends.Options{Servers: []string{node.Addr()}})
	holder := be.Open("holder")
	run := claim.Run{Job: "job.newcomer", At: base}
	const lease = time.Minute
	held, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	if err != nil {
		t.Fatal(err)
	}
	node.Restart()
	newcomer := be.Open("newcomer")
	_, err = answered(t, func() (*claim.Claim, error) { return claim.ClaimOne(ctxT(t), newcomer, run, lease) })
	heldForLoss(t, err, "newcomer's first claim after the restart")
	if err := holder.Renew(ctxT(t), held, lease); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("renewal of a claim the restart erased: %v, want ErrLeaseLost", err)
	}
}

// TestNewNamespaceWaitsOnlyOnAYoungServer: a namespace nobody declared new
// (redisnode.MarkNew) cannot be told from one whose server restarted empty.
// On a server up for less than a lease it is held for one; on a server up
// for longer every claim from an earlier incarnation has expired, and it
// is granted at once.
func TestNewNamespaceWaitsOnlyOnAYoungServer(t *testing.T) {
	young := testenv.StartRedis(t)
	c := redis.New(newClient(young.Addr()), redis.Options{Instance: "a", Prefix: testenv.RandomPrefix(t.Name())})
	defer c.Close()
	// A lease far longer than the server could have taken to start.
	_, err := claim.ClaimOne(ctxT(t), c, claim.Run{Job: "job.young", At: base}, time.Minute)
	heldForLoss(t, err, "first claim in a new namespace on a server just started")

	const lease = time.Second

	client, prefix := isolated(t)
	upFor(t, client, 1) // the shared server may have been started this very second
	old := redis.New(client, redis.Options{Instance: "a", Prefix: prefix})
	if _, err := claim.ClaimOne(ctxT(t), old, claim.Run{Job: "job.old", At: base}, lease); err != nil {
		t.Fatalf("first claim in a new namespace on a server up for more than the lease: %v", err)
	}
}

// TestANamespaceEmptiedUnderALongRunningServerIsHeld: a server up for
// longer than a lease lost a namespace's keys while a run was held (a
// FLUSHALL, a FLUSHDB, keys evicted). A replica that had never seen the
// marker (just started, or a one-shot command) took its absence for a new
// namespace, wrote it anew with no guard, and was granted the run beside
// its holder; the old replicas then found a marker of this server and
// reported nothing (an outside review). The server's record of a bulk
// deletion now starts the guard for the newcomer too, and the holder's
// next claim reports the loss.
func TestANamespaceEmptiedUnderALongRunningServerIsHeld(t *testing.T) {
	const lease = time.Second // the newcomer's: the server is up for longer
	evict := func(t *testing.T, c *goredis.Client, prefix string) {
		// Keys evicted under a memory limit, the namespace's among them:
		// allkeys-random evicts some of the junk for certain, and what it
		// left of the namespace's keys goes by hand.
		used, err := c.Info(ctxT(t), "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, v, _ := strings.Cut(used, "used_memory:")
		v, _, _ = strings.Cut(v, "\r")
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("used_memory %q: %v", v, err)
		}
		for _, kv := range [][2]string{{"maxmemory", strconv.Itoa(n + 200_000)}, {"maxmemory-policy", "allkeys-random"}} {
			if err := c.ConfigSet(ctxT(t), kv[0], kv[1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		junk := strings.Repeat("x", 10_000)
		for i := 0; i < 200; i++ {
			_ = c.Set(ctxT(t), fmt.Sprintf("junk:%d", i), junk, 0).Err() // refused once nothing is left to evict
		}
		for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "0"}} {
			if err := c.ConfigSet(ctxT(t), kv[0], kv[1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		stats, _ := c.Info(ctxT(t), "stats").Result()
		if strings.Contains(stats, "evicted_keys:0\r") {
			t.Fatal("no key was evicted: the test evicts nothing")
		}
		keys, err := c.Keys(ctxT(t), prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			must(t, c.Del(ctxT(t), keys...).Err())
		}
	}
	for name, empty := range map[string]func(*testing.T, *goredis.Client, string){
		"flushall": func(t *testing.T, c *goredis.Client, _ string) { must(t, c.FlushAll(ctxT(t)).Err()) },
		"flushdb":  func(t *testing.T, c *goredis.Client, _ string) { must(t, c.FlushDB(ctxT(t)).Err()) },
		"evicted":  evict,
	} {
		t.Run(name, func(t *testing.T) {
			be, client := private(t)
			holder := be.Open("holder")
			run := claim.Run{Job: "job.emptied", At: base}
			held, err := claim.ClaimOne(ctxT(t), holder, run, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			upFor(t, client, 2)

			empty(t, client, be.Config.Redis.Prefix)
			newcomer := be.Open("newcomer")
			_, err = claim.ClaimOne(ctxT(t), newcomer, run, lease)
			heldForLoss(t, err, "a newcomer's claim of a run held when the namespace was emptied")
			if err := holder.Renew(ctxT(t), held, time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
				t.Fatalf("renewal of the emptied run: %v, want ErrLeaseLost", err)
			}
			_, err = claim.ClaimOne(ctxT(t), holder, claim.Run{Job: "job.emptied", At: base.Add(time.Minute)}, lease)
			heldForLoss(t, err, "the holder's next claim")
		})
	}
}

// TestAnEvictingPolicySetWhileRunningRefusesClaims: Open refused a server
// that may evict claims, but a policy set to evict later (CONFIG SET, a
// restart with another config) went unnoticed; the server evicted live
// claims and runs started twice (an outside review). Within a look of the
// watcher (a quarter of the lease), claims are now refused, naming the
// policy, and so is readiness, until the policy is set back.
func TestAnEvictingPolicySetWhileRunningRefusesClaims(t *testing.T) {
	const lease = 400 * time.Millisecond
	be, client := private(t)
	c := be.Open("a")
	at := base
	claimNext := func() error {
		at = at.Add(time.Minute)
		cl, err := claim.ClaimOne(ctxT(t), c, claim.Run{Job: "job.evict", At: at}, lease)
		if err == nil {
			// A terminal release: the watcher runs from the first one on.
			must(t, claim.ReleaseOne(ctxT(t), c, cl, claim.Succeeded))
		}
		return err
	}
	must(t, claimNext())

	must(t, client.ConfigSet(ctxT(t), "maxmemory", "1gb").Err())
	must(t, client.ConfigSet(ctxT(t), "maxmemory-policy", "allkeys-lru").Err())
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := claimNext()
		if errors.Is(err, claim.ErrUnavailable) && strings.Contains(err.Error(), "allkeys-lru") {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("claim on a server set to evict, 20s after the change: %v, want ErrUnavailable naming the policy", err)
		}
		time.Sleep(lease / 8) // polling the watcher's next look; no event to wait on
	}
	if err := c.Ping(ctxT(t)); err == nil || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("readiness on a server set to evict: %v, want an error naming the policy", err)
	}

	must(t, client.ConfigSet(ctxT(t), "maxmemory-policy", "noeviction").Err())
	deadline = time.Now().Add(20 * time.Second)
	for {
		err := claimNext()
		if err == nil {
			break
		}
		if !errors.Is(err, claim.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("claim once the policy was set back: %v, want granted", err)
		}
		time.Sleep(lease / 8) // polling the watcher's next look; no event to wait on
	}
	must(t, c.Ping(ctxT(t)))
}

// TestARunThatFinishedWhileItsRecordWasLostStaysDone: the server lost the
// record of a run while its holder ran it (a FLUSHALL). The holder's
// release found nothing and was refused, "taken over" though nobody had
// taken it; after the restart guard the run was granted again as attempt
// 1, and ran again, or was recorded missed though it had run (an outside
// review). The release now writes the run's end down where no record is,
// and stands: the next claim finds the run done, with its holder's
// outcome.
func TestARunThatFinishedWhileItsRecordWasLostStaysDone(t *testing.T) {
	const lease = time.Second
	be, client := private(t)
	holder, other := be.Open("holder"), be.Open("other")
	run := claim.Run{Job: "job.gone", At: base}
	cl, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	if err != nil {
		t.Fatal(err)
	}

	must(t, client.FlushAll(ctxT(t)).Err())
	if err := claim.ReleaseOne(ctxT(t), holder, cl, claim.Succeeded); err != nil {
		t.Fatalf("release of a run whose record the server lost: %v, want it written down", err)
	}
	doneAfterGuard(t, other, run, lease, "another replica's claim of the finished run")
	recs, err := other.History(ctxT(t), run.Job, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Status != claim.Succeeded || recs[0].Holder != "holder" || recs[0].Fence != cl.Fence {
		t.Fatalf("history of the run: %+v, want it succeeded on holder with fence %d", recs, cl.Fence)
	}
}

// TestALossNoClaimMeetsIsReported: the server restarted empty while no
// claim came (an idle fleet, a job every hour). The done watcher started
// the restart guard and wrote the done markers back, but nothing said the
// server had lost its data: the runner reports only losses a claim meets
// (an outside review). The watcher now reports the guard it finds begun.
func TestALossNoClaimMeetsIsReported(t *testing.T) {
	const lease = time.Second
	node := testenv.StartRedis(t)
	c := backends.Prepare(t, "redis", backends.Options{Servers: []string{node.Addr()}}).Open("idle")
	reports := make(chan *claim.DataLossError, 10)
	c.Claimer.(*redis.Claimer).WatchLoss(func(l *claim.DataLossError) { reports <- l })
	cl, err := claim.ClaimOne(ctxT(t), c, claim.Run{Job: "job.idle", At: base}, lease)
	if err != nil {
		t.Fatal(err)
	}
	must(t, claim.ReleaseOne(ctxT(t), c, cl, claim.Succeeded)) // the watcher runs from here on

	restarted := time.Now()
	node.Restart()
	select {
	case l := <-reports:
		if l.Until.Before(restarted) || !strings.Contains(l.Error(), node.Addr()) {
			t.Fatalf("loss reported: %v, want the guard begun after the restart, naming the server", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no loss reported 20s after the server restarted empty, with no claim made")
	}
}

// private starts a Redis server of t's own, prepares a namespace on it
// (declared new) and returns the namespace and a client that reaches the
// server directly, to flush or configure it.
func private(t *testing.T) (*backends.Namespace, *goredis.Client) {
	t.Helper()
	node := testenv.StartRedis(t)
	be := backends.Prepare(t, "redis", backends.Options{Servers: []string{node.Addr()}})
	client := newClient(node.Addr())
	t.Cleanup(func() { _ = client.Close() })
	return be, client
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestWriteBackOfManyRunsLandsWithinTheGuard: a replica finished 30,000
// runs just before the server restarted empty; under a short lease and
// while another replica keeps the server busy, its write-back of their
// done markers lands before the restart guard lets anyone claim them.
func TestWriteBackOfManyRunsLandsWithinTheGuard(t *testing.T) {
	testenv.WallClock(t)
	node := testenv.StartRedis(t)
	be := backends.Prepare(t, "redis", backends.Options{Servers: []string{node.Addr()}})
	finisher, standby, busy := be.Open("finisher"), be.Open("standby"), be.Open("busy")
	const lease, n, batch = 2 * time.Second, 30_000, 2_000
	runs := make([]claim.Run, n)
	for i := range runs {
		runs[i] = claim.Run{Job: fmt.Sprintf("job.%d", i%10), At: base.Add(time.Duration(i) * time.Second)}
	}
	for i := 0; i < n; i += batch {
		cls, errs := finisher.Claim(ctxT(t), runs[i:i+batch], lease)
		outs := make([]claim.Status, len(cls))
		for k, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
			outs[k] = claim.Succeeded
		}
		for _, err := range finisher.Release(ctxT(t), cls, outs) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	// The standby has claimed on the server before: it knows the marker.
	probe := claim.Run{Job: "job.probe", At: base}
	if _, err := claim.ClaimOne(ctxT(t), standby, probe, lease); err != nil {
		t.Fatal(err)
	}

	node.Restart()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { // load: a replica claiming other runs as fast as it can
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			more := make([]claim.Run, 200)
			for k := range more {
				more[k] = claim.Run{Job: "job.busy", At: base.Add(time.Duration(i*200+k) * time.Second)}
			}
			_, _ = busy.Claim(ctxT(t), more, lease)
		}
	})
	defer func() { close(stop); wg.Wait() }()

	grantAfterGuard(t, standby, probe, lease)
	_, errs := standby.Claim(ctxT(t), runs, lease)
	granted := 0
	for i, err := range errs {
		if !errors.Is(err, claim.ErrDone) {
			if granted++; granted == 1 {
				t.Errorf("claim of %s after the guard: %v, want ErrDone", runs[i].ID(), err)
			}
		}
	}
	if granted > 0 {
		t.Fatalf("%d of %d runs finished before the restart were not done after the guard", granted, n)
	}
}

// TestAFinishedRunStaysDoneWhileAReplicaThatSawItIsUp: the replica that
// finished a run is gone; another replica's claim had found it done. The
// server restarts empty while that replica cannot reach it, for longer
// than a lease, so the server's uptime no longer says it restarted. That
// replica's first script after the link heals starts the restart guard
// (it saw the marker of an earlier incarnation), and its write-back lands
// within the guard: a newcomer is held, then finds the run done, never
// granted.
func TestAFinishedRunStaysDoneWhileAReplicaThatSawItIsUp(t *testing.T) {
	testenv.WallClock(t)
	node := testenv.StartRedis(t)
	proxy, err := faultproxy.New(node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	direct := newClient(node.Addr())
	t.Cleanup(func() { _ = direct.Close() })
	prefix := testenv.RandomPrefix(t.Name())
	if err := redisnode.MarkNew(ctxT(t), direct, prefix); err != nil {
		t.Fatal(err)
	}
	open := func(instance, addr string) *redis.Claimer {
		c := redis.New(newClient(addr), redis.Options{Instance: instance, Prefix: prefix})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	const lease = time.Second
	finished, other := claim.Run{Job: "job.finished", At: base}, claim.Run{Job: "job.other", At: base}

	finisher, witness := open("finisher", node.Addr()), open("witness", proxy.Addr())
	cl, err := claim.ClaimOne(ctxT(t), finisher, finished, lease)
	if err != nil {
		t.Fatal(err)
	}
	if err := claim.ReleaseOne(ctxT(t), finisher, cl, claim.Succeeded); err != nil {
		t.Fatal(err)
	}
	_ = finisher.Close() // gone, and what it remembered with it
	if _, err := claim.ClaimOne(ctxT(t), witness, finished, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("witness's claim of the finished run: %v, want ErrDone", err)
	}

	proxy.Partition(true)
	node.Restart()
	upFor(t, direct, 2) // its uptime now says nothing of the restart (lease: 1s)
	proxy.Partition(false)

	_, err = answered(t, func() (*claim.Claim, error) { return claim.ClaimOne(ctxT(t), witness, other, lease) })
	heldForLoss(t, err, "witness's first claim after the restart, on a server up for longer than a lease")
	newcomer := open("newcomer", node.Addr())
	doneAfterGuard(t, newcomer, finished, lease, "newcomer's claim of a run finished before the restart")
}

// TestARunThatFinishedWhileItsRecordWasWipedAndWritesRefusedStaysDone:
// the server was made a replica of an empty one (REPLICAOF: its data
// wiped, and every write refused, READONLY) while a run's handler ran.
// Its release found no record and could not write the run's end down.
// Both were reported at once, "lease lost" among them, so the runner
// gave the release up: the run ran again as attempt 1, or was recorded
// missed though it ran (an outside review, through the binary: 6 of 6
// tries). A refused write-down is unanswered: retried once the server
// takes writes again, it lands, and the run stays done.
func TestARunThatFinishedWhileItsRecordWasWipedAndWritesRefusedStaysDone(t *testing.T) {
	const lease = time.Second
	be, client := private(t)
	empty := testenv.StartRedis(t)
	holder, other := be.Open("holder"), be.Open("other")
	run := claim.Run{Job: "job.wiped", At: base}
	cl, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	if err != nil {
		t.Fatal(err)
	}

	replicate(t, client, empty.Addr())
	err = claim.ReleaseOne(ctxT(t), holder, cl, claim.Succeeded)
	if !errors.Is(err, claim.ErrUnavailable) || errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("release with the record wiped and writes refused: %v, want ErrUnavailable only (retried), not ErrLeaseLost", err)
	}

	must(t, client.ReplicaOf(ctxT(t), "NO", "ONE").Err())
	if err := claim.ReleaseOne(ctxT(t), holder, cl, claim.Succeeded); err != nil {
		t.Fatalf("the retried release, writes taken again: %v, want the run's end written down", err)
	}
	doneAfterGuard(t, other, run, lease, "another replica's claim of the finished run")
	recs, err := other.History(ctxT(t), run.Job, 1)
	must(t, err)
	if len(recs) != 1 || recs[0].Status != claim.Succeeded || recs[0].Holder != "holder" || recs[0].Fence != cl.Fence {
		t.Fatalf("history of the run: %+v, want it succeeded on holder with fence %d", recs, cl.Fence)
	}
}

// TestAServerMadeAReplicaOfItsOwnEarlierCopyIsHeld: a copy of the server
// was taken (a replica, detached), the server went on (a run released),
// and then the server was made a replica of that copy and promoted again
// (REPLICAOF, as a failover tool re-attaching an old master under a stale
// replica does). Its data went back in time while its process, and so its
// run_id, stayed: the marker in the copy named it, no guard began, and a
// standby took over the finished run, which ran again (an outside review:
// 2 of 2 tries, with no data loss reported). The marker now names the
// server's replication history too, which a full sync replaces: the
// guard begins, the loss is reported, and the holder's write-back keeps
// the run done.
func TestAServerMadeAReplicaOfItsOwnEarlierCopyIsHeld(t *testing.T) {
	const lease = 3 * time.Second // the holder's watcher writes back within it, on a loaded machine too
	be, client, staleClient, staleAddr := privatePair(t)
	holder, other := be.Open("holder"), be.Open("other")
	run := claim.Run{Job: "job.rolledback", At: base}
	cl, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	if err != nil {
		t.Fatal(err)
	}

	copyOf(t, staleClient, be.Servers()[0]) // the copy: the run running
	must(t, claim.ReleaseOne(ctxT(t), holder, cl, claim.Succeeded))
	copyOf(t, client, staleAddr) // the server's data is the copy's now

	_, err = claim.ClaimOne(ctxT(t), other, run, lease)
	heldForLoss(t, err, "another replica's claim after the server's data went back to the copy")
	doneAfterGuard(t, other, run, lease, "another replica's claim of the finished run")
}

// replicate makes the server behind client a replica of the one at addr,
// as REPLICAOF does (its data replaced by a full sync), and waits until
// it is in sync.
func replicate(t *testing.T, client *goredis.Client, addr string) {
	t.Helper()
	master := newClient(addr)
	defer master.Close()
	must(t, master.ConfigSet(ctxT(t), "repl-diskless-sync-delay", "0").Err())
	host, port, _ := strings.Cut(addr, ":")
	must(t, client.ReplicaOf(ctxT(t), host, port).Err())
	for deadline := time.Now().Add(30 * time.Second); ; {
		info, err := client.Info(ctxT(t), "replication").Result()
		must(t, err)
		if strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not in sync with %s after 30s:\n%s", addr, info)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the full sync; no event to wait on
	}
}

// TestAFailoverAndBackHoldsOnce: the server failed over to its replica
// and was promoted back (FAILOVER TO, then REPLICAOF NO ONE): a partial
// resync, nothing lost, but its replication history changed. The guard
// begins once and ends a lease later; runs are granted again. When the
// claim function kept the history in its Lua state (which neither sync
// makes anew) while the done watcher's script read it fresh, each found
// the other's in the marker and began the guard again, for good: no run
// was granted for as long as an outside review watched (30 s), with a
// loss reported every few milliseconds.
func TestAFailoverAndBackHoldsOnce(t *testing.T) {
	const lease = time.Second
	be, client, standbyClient, standbyAddr := privatePair(t)
	holder, other := be.Open("holder"), be.Open("other")
	cl, err := claim.ClaimOne(ctxT(t), holder, claim.Run{Job: "job.before", At: base}, lease)
	must(t, err)
	must(t, claim.ReleaseOne(ctxT(t), holder, cl, claim.Succeeded)) // the done watcher runs from here on

	replicate(t, standbyClient, be.Servers()[0])
	for deadline := time.Now().Add(30 * time.Second); ; { // FAILOVER wants the replica online on the master's side too
		info, err := client.Info(ctxT(t), "replication").Result()
		must(t, err)
		if strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica is not online after 30s:\n%s", info)
		}
		time.Sleep(20 * time.Millisecond) // no event to wait on
	}
	host, port, _ := strings.Cut(standbyAddr, ":")
	must(t, client.Do(ctxT(t), "FAILOVER", "TO", host, port).Err())
	for deadline := time.Now().Add(30 * time.Second); ; {
		info, err := client.Info(ctxT(t), "replication").Result()
		must(t, err)
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not failed over after 30s:\n%s", info)
		}
		time.Sleep(20 * time.Millisecond) // the failover ends when it ends; no event to wait on
	}
	must(t, client.ReplicaOf(ctxT(t), "NO", "ONE").Err())
	// Until the done watcher has found the new history and named it in
	// the marker: then the claims meet the marker it wrote.
	for deadline := time.Now().Add(30 * time.Second); ; {
		info, err := client.Info(ctxT(t), "replication").Result()
		must(t, err)
		_, replid, _ := strings.Cut(info, "master_replid:")
		replid, _, _ = strings.Cut(replid, "\r")
		markers, err := client.Keys(ctxT(t), "*server").Result()
		must(t, err)
		if len(markers) == 1 && client.HGet(ctxT(t), markers[0], "replid").Val() == replid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the marker does not name the history %s after 30s (markers %v)", replid, markers)
		}
		time.Sleep(20 * time.Millisecond) // the watcher looks every lease/4; no event to wait on
	}

	run := claim.Run{Job: "job.after", At: base}
	granted := grantAfterGuard(t, other, run, lease)
	if granted.Holder != "other" {
		t.Fatalf("granted to %q, want other", granted.Holder)
	}
}

// TestARewindWhileWritesAreRefusedStaysDone: the server went back to an
// earlier copy of its data while it refused writes (out of memory), and
// took writes again only later. The marker's rewrite began the guard
// while writes were refused (a DEL first, which an out-of-memory server
// lets through, and then every later write of the script), the holder's
// write-back was refused and never sent again, the guard ran out, and
// the finished run was granted again (the explorer's rewind class). The
// guard now begins when writes land, a write-back that did not land is
// sent again, and the run stays done.
func TestARewindWhileWritesAreRefusedStaysDone(t *testing.T) {
	const lease = 3 * time.Second // the holder's watcher writes back within it, on a loaded machine too
	be, client, staleClient, staleAddr := privatePair(t)
	holder, other := be.Open("holder"), be.Open("other")
	run := claim.Run{Job: "job.rewound", At: base}
	cl, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	must(t, err)
	copyOf(t, staleClient, be.Servers()[0])
	must(t, claim.ReleaseOne(ctxT(t), holder, cl, claim.Succeeded))

	must(t, client.ConfigSet(ctxT(t), "maxmemory", "1").Err())
	copyOf(t, client, staleAddr)
	// Writes refused while the holder's watcher looks, several times,
	// for longer than a guard begun then would last.
	time.Sleep(lease + lease/2)
	must(t, client.ConfigSet(ctxT(t), "maxmemory", "0").Err())
	doneAfterGuard(t, other, run, lease, "another replica's claim of the finished run")
}

// TestAWatcherFirstLookingAfterARewindWritesBack: the holder's done
// watcher first read the marker only after the server had gone back to
// an earlier copy of its data, under the same run_id (a rewind keeps the
// process). Its first look had been refused (writes refused, out of
// memory) or came late (a loaded machine). The first reading was taken
// for the baseline, nothing was written back, and once the guard ran out
// the finished run was granted again (CI, 1 in 5 runs of
// TestARewindWhileWritesAreRefusedStaysDone; 2 in 25 here beside two busy
// loops). A first reading that names a guard writes back.
func TestAWatcherFirstLookingAfterARewindWritesBack(t *testing.T) {
	const lease = 3 * time.Second // the holder's watcher writes back within it, on a loaded machine too
	be, client, staleClient, staleAddr := privatePair(t)
	holder, other := be.Open("holder"), be.Open("other")
	launch := redis.DeferWatch(holder.Claimer)
	run := claim.Run{Job: "job.rewound", At: base}
	cl, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	must(t, err)
	copyOf(t, staleClient, be.Servers()[0])
	must(t, claim.ReleaseOne(ctxT(t), holder, cl, claim.Succeeded))
	copyOf(t, client, staleAddr)
	launch() // the watcher's first look: after the rewind
	doneAfterGuard(t, other, run, lease, "another replica's claim of the finished run")
}

// TestAFirstReplicaIsNoLoss: a master given its first replica (with an
// AOF, as production runs it) takes a new replication id with its
// backlog, its data untouched. Read as another history, it began the
// restart guard: every run held for a lease, and a data loss reported,
// for adding a replica (the explorer's copy of the server showed it).
// Only a server that has been a replica since it started is suspect.
func TestAFirstReplicaIsNoLoss(t *testing.T) {
	const lease = time.Second
	node := testenv.StartRedis(t, "--appendonly", "yes")
	be := backends.Prepare(t, "redis", backends.Options{Servers: []string{node.Addr()}})
	client := newClient(node.Addr())
	t.Cleanup(func() { _ = client.Close() })
	replica := testenv.StartRedis(t)
	replicaClient := newClient(replica.Addr())
	t.Cleanup(func() { _ = replicaClient.Close() })
	holder, other := be.Open("holder"), be.Open("other")
	cl, err := claim.ClaimOne(ctxT(t), holder, claim.Run{Job: "job.held", At: base}, time.Minute)
	must(t, err)

	replid := func() string {
		info, err := client.Info(ctxT(t), "replication").Result()
		must(t, err)
		_, id, _ := strings.Cut(info, "master_replid:")
		id, _, _ = strings.Cut(id, "\r")
		return id
	}
	before := replid()
	copyOf(t, replicaClient, node.Addr()) // the node is still a master
	if replid() == before {
		t.Fatalf("the master kept its replication id %s when given its first replica: this test's premise is gone", before)
	}
	if _, err := claim.ClaimOne(ctxT(t), other, claim.Run{Job: "job.new", At: base}, lease); err != nil {
		t.Fatalf("a claim after the master was given a replica: %v, want granted", err)
	}
	if err := holder.Renew(ctxT(t), cl, time.Minute); err != nil {
		t.Fatalf("a renewal after the master was given a replica: %v", err)
	}
}

// TestAnEarlierAttemptBackFromACopyIsWrittenOver: the server went back
// to a copy taken between a run's first attempt (handed back,
// interrupted) and its second (finished). The copy's record is the first
// attempt's, of this server's run_id, another token: the write-back took
// it for a newer grant and left it, and after the guard the run was
// granted again (the explorer's rewind class). A live record granted
// before the guard began is written over now.
func TestAnEarlierAttemptBackFromACopyIsWrittenOver(t *testing.T) {
	const lease = 3 * time.Second // the holder's watcher writes back within it, on a loaded machine too
	be, client, staleClient, staleAddr := privatePair(t)
	holder, other := be.Open("holder"), be.Open("other")
	run := claim.Run{Job: "job.again", At: base}
	first, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	must(t, err)
	must(t, claim.ReleaseOne(ctxT(t), holder, first, claim.Interrupted))
	copyOf(t, staleClient, be.Servers()[0]) // the copy: the first attempt, handed back
	second, err := claim.ClaimOne(ctxT(t), holder, run, lease)
	must(t, err)
	if second.Attempt != 2 {
		t.Fatalf("second claim: attempt %d, want 2", second.Attempt)
	}
	must(t, claim.ReleaseOne(ctxT(t), holder, second, claim.Succeeded))

	copyOf(t, client, staleAddr)
	doneAfterGuard(t, other, run, lease, "another replica's claim of the finished run")
}

// privatePair is private, with a second server of t's own, empty: a
// client that reaches it directly, and its address.
func privatePair(t *testing.T) (*backends.Namespace, *goredis.Client, *goredis.Client, string) {
	t.Helper()
	be, client := private(t)
	second := testenv.StartRedis(t)
	secondClient := newClient(second.Addr())
	t.Cleanup(func() { _ = secondClient.Close() })
	return be, client, secondClient, second.Addr()
}

// copyOf makes the server behind client a copy of the one at addr, as it
// is now: its replica until in sync (replicate), then promoted.
func copyOf(t *testing.T, client *goredis.Client, addr string) {
	t.Helper()
	replicate(t, client, addr)
	must(t, client.ReplicaOf(ctxT(t), "NO", "ONE").Err())
}
