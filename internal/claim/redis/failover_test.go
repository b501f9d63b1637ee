package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/procs"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestClusterFailoverHoldsWhatThePromotedReplicaMissed kills (SIGKILL) the
// master that holds one job's claims, after writes its replica never got:
// replica-a's claim of a live run and its release of a finished one
// (replication is asynchronous; here the replica's link is cut first, so
// the loss is certain). The replica is promoted without them. Then:
//   - replica-b is not granted the live run while replica-a's lease could
//     still be live: the promoted master's restart guard holds every run
//     of the bucket for a lease, and says so (claim.DataLossError);
//   - replica-a's renewal is refused, never granted on the new master;
//   - the finished run stays done: replica-a writes its done marker back
//     within the guard;
//   - fences of the job keep growing across the failover;
//   - claims resume on the promoted master after the guard, and at once
//     on the masters that did not fail over.
func TestClusterFailoverHoldsWhatThePromotedReplicaMissed(t *testing.T) {
	cluster := testenv.StartRedisCluster(t)
	seeds := cluster.Addrs()
	ns := backends.Prepare(t, "redis", onCluster(seeds))
	a, b := ns.Open("replica-a"), ns.Open("replica-b")
	admin := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: seeds, MaxRetries: -1})
	defer admin.Close()
	layout := redisnode.New(admin, redisnode.Options{}, 0, 1)
	masterOf := func(job string) string {
		t.Helper()
		m, err := admin.MasterForKey(ctxT(t), "{"+strconv.Itoa(layout.Bucket(job))+"}")
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	// The lease outlives the failover (a second of silence, then an
	// election), so a claim made just before the kill is still live
	// when the promoted master first answers: only the guard keeps it.
	const lease = 6 * time.Second
	const job = "job.live"
	victim := masterOf(job)
	other := ""
	for i := 0; other == ""; i++ {
		if j := fmt.Sprintf("job.other.%d", i); masterOf(j) != victim {
			other = j
		}
	}
	replicas, err := cluster.ReplicasOf(ctxT(t), victim)
	if err != nil || len(replicas) != 1 {
		t.Fatalf("replicas of %s: %v, %v", victim, replicas, err)
	}
	replica := cluster.Node(replicas[0])

	// Before: runs claimed and finished, replicated as usual.
	var highest int64
	for i := range 5 {
		cl, err := claim.ClaimOne(ctxT(t), a, claim.Run{Job: job, At: base.Add(time.Duration(i) * time.Minute)}, lease)
		if err != nil {
			t.Fatal(err)
		}
		highest = max(highest, cl.Fence)
		if err := claim.ReleaseOne(ctxT(t), a, cl, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := claim.ClaimOne(ctxT(t), a, claim.Run{Job: other, At: base}, lease); err != nil {
		t.Fatal(err)
	}

	// The replica stops, and the master drops its link, so that nothing
	// written from now on reaches it.
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = replica.Resume()
		}
	}()
	direct := goredis.NewClient(&goredis.Options{Addr: victim, MaxRetries: -1})
	if err := direct.ClientKillByFilter(ctxT(t), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	_ = direct.Close()
	live, finished := claim.Run{Job: job, At: base.Add(time.Hour)}, claim.Run{Job: job, At: base.Add(2 * time.Hour)}
	held, err := claim.ClaimOne(ctxT(t), a, live, lease)
	if err != nil {
		t.Fatal(err)
	}
	done, err := claim.ClaimOne(ctxT(t), a, finished, lease)
	if err != nil {
		t.Fatal(err)
	}
	if err := claim.ReleaseOne(ctxT(t), a, done, claim.Succeeded); err != nil {
		t.Fatal(err)
	}
	trusted := held.Requested.Add(lease) // replica-a trusts its claim until then
	highest = max(highest, held.Fence, done.Fence)

	cluster.Node(victim).Stop()
	killed := time.Now()
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	t.Logf("killed master %s; its replica %s missed a claim and a release", victim, replicas[0])

	// replica-b bids for the live run until it wins it. Every refusal
	// is the cluster being down, or the guard.
	var firstGuard time.Time
	var granted *claim.Claim
	for deadline := time.Now().Add(60 * time.Second); granted == nil; {
		sent := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		cl, err := claim.ClaimOne(ctx, b, live, lease)
		cancel()
		var loss *claim.DataLossError
		switch {
		case err == nil:
			granted = cl
		case errors.Is(err, claim.ErrHeld) && errors.As(err, &loss):
			if firstGuard.IsZero() {
				firstGuard = sent
				t.Logf("guard after %v: %v", sent.Sub(killed).Round(time.Millisecond), err)
			}
		case errors.Is(err, claim.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		default:
			t.Fatalf("bid for %s after the failover: %v, want unavailable or held by the guard", live.ID(), err)
		}
		if granted == nil && time.Now().After(deadline) {
			t.Fatalf("%s not granted a minute after the kill: %v", live.ID(), err)
		}
		if granted == nil {
			time.Sleep(50 * time.Millisecond) // polling a server-side guard; no event to wait on
		}
	}
	// The grant's server time (same host, same clock) is its deadline
	// less the lease.
	if at := granted.Deadline.Add(-lease); at.Before(trusted) {
		t.Fatalf("%s granted to replica-b at %v, while replica-a trusted its claim until %v",
			live.ID(), at.Format(time.RFC3339Nano), trusted.Format(time.RFC3339Nano))
	}
	if firstGuard.IsZero() || !firstGuard.Before(trusted) {
		t.Logf("the failover outlasted replica-a's lease (guard first seen %v after the kill); the guard was not needed",
			firstGuard.Sub(killed))
	}
	if granted.Fence <= highest || granted.Attempt != 1 {
		t.Fatalf("grant after the failover: fence %d, attempt %d; want a fence above %d, and attempt 1 "+
			"(the promoted replica never had replica-a's claim)", granted.Fence, granted.Attempt, highest)
	}
	// replica-a's client may still be finding the promoted master.
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := a.Renew(ctxT(t), held, lease)
		if errors.Is(err, claim.ErrLeaseLost) {
			break
		}
		if !errors.Is(err, claim.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("replica-a's renewal on the promoted master: %v, want ErrLeaseLost", err)
		}
		time.Sleep(50 * time.Millisecond) // polling until the client reaches the new master
	}
	if _, err := claim.ClaimOne(ctxT(t), b, finished, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("the run replica-a finished before the failover: %v, want ErrDone (written back)", err)
	}
	fresh, err := claim.ClaimOne(ctxT(t), b, claim.Run{Job: job, At: base.Add(3 * time.Hour)}, lease)
	if err != nil || fresh.Fence <= granted.Fence {
		t.Fatalf("a fresh run on the promoted master: %+v, %v; want granted above fence %d", fresh, err, granted.Fence)
	}
	if _, err := claim.ClaimOne(ctxT(t), b, claim.Run{Job: other, At: base.Add(time.Hour)}, lease); err != nil {
		t.Fatalf("a run on a master that did not fail over: %v", err)
	}
	t.Logf("claims resumed on the promoted master %v after the kill", time.Since(killed).Round(time.Millisecond))
}

// TestAPausedReplicaNodeLeavesTheClusterReady: a replica node with no
// slots stops answering (SIGSTOP, a GC). Readiness (Ping) does not wait on
// it: it read 503 on about one probe in four (an outside review), since
// its check of the masters reloaded the slot map from a random node first,
// and a paused one held the probe's whole time.
func TestAPausedReplicaNodeLeavesTheClusterReady(t *testing.T) {
	cluster := testenv.StartRedisCluster(t)
	seeds := cluster.Addrs()
	c := backends.Prepare(t, "redis", onCluster(seeds)).Open("replica-a")
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	var paused *procs.Redis
	for _, a := range seeds {
		if role, err := cluster.Role(ctxT(t), a); err == nil && role == "slave" {
			paused = cluster.Node(a)
			break
		}
	}
	if paused == nil {
		t.Fatal("no replica node")
	}
	if err := paused.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = paused.Resume() }()
	for i := range 20 {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := c.Ping(ctx)
		cancel()
		if err != nil {
			t.Fatalf("probe %d with replica %s paused: %v, want ready", i+1, paused.Addr(), err)
		}
	}
}
