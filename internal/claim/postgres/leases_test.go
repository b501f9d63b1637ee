package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestLeaseUpkeepDoesNotQueueBehindTheMainPool: with every connection of
// the main pool taken (slow claims and reads on a slow link), a renewal
// and a release, alone and batched, still go through at once on the lease
// pool: a run that has finished, or still works, keeps its lease instead
// of waiting its turn past the trust window.
func TestLeaseUpkeepDoesNotQueueBehindTheMainPool(t *testing.T) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	a := ns.OpenClient("replica-a", backends.Client{MaxConns: 1})
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	runs := []claim.Run{{Job: "job.leases", At: at}, {Job: "job.leases", At: at.Add(time.Minute)}, {Job: "job.leases", At: at.Add(2 * time.Minute)}}
	cls, errs := a.Claim(t.Context(), runs, time.Minute)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %s: %v", runs[i].ID(), err)
		}
	}

	// The main pool's only connection, held as a slow read would hold it.
	conn, err := a.DB.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() }) // before the pool closes, which waits for it
	hctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err = a.History(hctx, "job.leases", 1)
	cancel()
	if err == nil {
		t.Fatal("History answered with the main pool's only connection held: the test holds nothing")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := a.Renew(ctx, cls[0], time.Minute); err != nil {
		t.Fatalf("renew with the main pool busy: %v", err)
	}
	if errs := a.Release(ctx, cls[:1], []claim.Status{claim.Succeeded}); errs[0] != nil {
		t.Fatalf("release with the main pool busy: %v", errs[0])
	}
	for i, err := range a.Release(ctx, cls[1:], []claim.Status{claim.Succeeded, claim.Failed}) {
		if err != nil {
			t.Fatalf("batched release of %s with the main pool busy: %v", cls[1+i].ID(), err)
		}
	}
	_ = conn.Close()

	recs, err := a.History(ctx, "job.leases", 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]claim.Status{}
	for _, r := range recs {
		got[r.RunID] = r.Status
	}
	want := map[string]claim.Status{runs[0].ID(): claim.Succeeded, runs[1].ID(): claim.Succeeded, runs[2].ID(): claim.Failed}
	for id, st := range want {
		if got[id] != st {
			t.Errorf("%s recorded %q, want %q", id, got[id], st)
		}
	}
}

// TestASlowLinkRenewsAndReleasesInOneRoundTrip: a replica's first renewal
// and first release used to connect the lease pool and then prepare their
// statement before sending it, three round trips and two. At 800ms round
// trips on a 3s lease they landed after the lease had ended, and another
// replica ran the finished run again (the fault table's latency row). The
// lease pool now keeps a connection open and sends its statements in one
// round trip: each call here gets a round trip and a half, which passes
// one round trip and no more, on a link slowed from before the replica
// opened its pools.
func TestASlowLinkRenewsAndReleasesInOneRoundTrip(t *testing.T) {
	t.Parallel() // it waits on the link for most of its time
	const oneWay = time.Second
	ns, proxy, via := proxied(t)
	proxy.SetLatency(oneWay)
	slow := ns.OpenClient("slow", backends.Client{Via: via})

	run := claim.Run{Job: "job.slow-link", At: time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC)}
	// The claim connects the main pool and sends its statements: two
	// round trips at least, in which the lease pool's connection, opened
	// in the background when the replica opened its pools, has been set up.
	cl, err := claim.ClaimOne(t.Context(), slow, run, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	within := func(what string, call func(context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 3*oneWay)
		defer cancel()
		start := time.Now()
		if err := call(ctx); err != nil {
			t.Fatalf("%s on a link of %v round trips: %v after %v, want done in one round trip", what, 2*oneWay, err, time.Since(start).Round(time.Millisecond))
		}
	}
	within("the first renewal", func(ctx context.Context) error { return slow.Renew(ctx, cl, time.Minute) })
	within("the first release", func(ctx context.Context) error { return claim.ReleaseOne(ctx, slow, cl, claim.Succeeded) })
}
