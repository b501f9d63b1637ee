package etcd_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/procs"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestPausedMemberKeepsLeases holds a claim while one member is stopped
// (SIGSTOP), as a stalled host: its connections stay open, nothing on
// them is answered, and the client cannot tell it from a slow member. The
// holder renews as the runner does (every lease/3, each renewal due
// before the trust window closes, a failed one tried again soon), then
// releases within the lease. With a quorum up, every renewal and the
// release must land in time: a claim lost here is a finished run that
// another replica executes again. A follower and the leader are paused in
// turn, a few times, so calls land on the paused member's connection.
func TestPausedMemberKeepsLeases(t *testing.T) {
	// Leases of 6s, trusted to a tenth of that: a test beside it that
	// starves the CPU would fail it for the machine's sake. With the
	// leader paused, a renewal waits out an election first (the election
	// timeout is 1s): at 3s leases, a renewal's 1.7s was too short for
	// that under load (one CI run in four). Still far below the 10s a
	// stalled member takes to be noticed by gRPC's keepalives, which is
	// what the test is about.
	testenv.WallClock(t)
	cluster := testenv.StartEtcd(t, 3)
	ns := backends.Prepare(t, "etcd", backends.Options{Servers: cluster.Endpoints()})
	holder := ns.Open("replica-a")

	const (
		lease   = 6 * time.Second
		handler = 5 * time.Second
		rounds  = 4
	)
	for i := range rounds {
		leader := leaderOf(t, cluster)
		var followers []*procs.EtcdMember
		for _, m := range cluster.Members() {
			if m != leader {
				followers = append(followers, m)
			}
		}
		paused := followers[i/2%len(followers)]
		if i%2 == 1 {
			// Writes wait for the followers to elect another leader.
			paused = leader
		}

		run := claim.Run{Job: "job.paused", At: base.Add(time.Duration(i) * time.Minute)}
		cl, err := claim.ClaimOne(ctxFor(t, 10*time.Second), holder, run, lease)
		if err != nil {
			t.Fatalf("round %d: claim: %v", i, err)
		}
		if err := paused.Pause(); err != nil {
			t.Fatal(err)
		}
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				if err := paused.Resume(); err != nil {
					t.Error(err)
				}
			}
		}
		t.Cleanup(resume)

		renewals, problem := keepAlive(t, holder, cl, lease, handler)
		if problem != nil {
			resume()
			t.Fatalf("round %d, %s paused: %v", i, paused.Name(), problem)
		}
		start := time.Now()
		err = claim.ReleaseOne(ctxFor(t, lease), holder, cl, claim.Succeeded)
		took := time.Since(start)
		resume()
		if err != nil {
			t.Fatalf("round %d, %s paused: release after %v: %v", i, paused.Name(), took.Round(time.Millisecond), err)
		}
		t.Logf("round %d, %s paused: %d renewals, release in %v", i, paused.Name(), renewals, took.Round(time.Millisecond))

		// The resumed member catches up before the next round pauses
		// the other one.
		if _, err := client(t, paused.Addr()).Get(ctxFor(t, 15*time.Second), "catch-up"); err != nil {
			t.Fatalf("%s after resuming: %v", paused.Name(), err)
		}
	}
}

// keepAlive renews cl for d as the runner does, and returns how many
// renewals landed, or why the claim was lost.
func keepAlive(t *testing.T, c claim.Claimer, cl *claim.Claim, lease, d time.Duration) (int, error) {
	margin := lease / 10
	end := time.Now().Add(d)
	next := time.Now().Add(lease / 3)
	renewals := 0
	for {
		wake := next
		if end.Before(wake) {
			wake = end
		}
		time.Sleep(time.Until(wake))
		if !time.Now().Before(end) {
			return renewals, nil
		}
		trusted := cl.TrustedUntil(margin)
		if !time.Now().Before(trusted) {
			return renewals, errors.New("lease not confirmed in time")
		}
		ctx := ctxFor(t, time.Until(trusted))
		start := time.Now()
		err := c.Renew(ctx, cl, lease)
		switch {
		case err == nil:
			renewals++
			next = time.Now().Add(lease / 3)
		case errors.Is(err, claim.ErrLeaseLost):
			return renewals, err
		case !time.Now().Before(cl.TrustedUntil(margin)):
			return renewals, fmt.Errorf("lease not confirmed in time: renewal failed after %v: %w",
				time.Since(start).Round(time.Millisecond), err)
		default:
			t.Logf("renewal failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
			next = time.Now().Add(100 * time.Millisecond)
		}
	}
}
