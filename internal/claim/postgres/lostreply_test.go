package postgres_test

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/faultproxy"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// proxied prepares a namespace and a fault proxy in front of its server;
// via routes a client through the proxy.
func proxied(t *testing.T) (*backends.Namespace, *faultproxy.Proxy, map[string]string) {
	t.Helper()
	ns := backends.Prepare(t, "postgres", backends.Options{})
	server := ns.Servers()[0]
	proxy, err := faultproxy.New(server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	return ns, proxy, map[string]string{server: proxy.Addr()}
}

// TestAClaimWhoseReplyWasLostLeavesNoGhost: the statement granted, the
// reply never came back (the connection dropped in its place). The caller
// hears the server was unavailable and runs nothing; the grant is handed
// back (interrupted), so another replica gets the run at once rather than
// after a whole lease held by nobody. Both ways a claim grants: a batch's
// insert, and a lone run's takeover. The lost grant never started, so it
// spends no attempt: the next holder's is the one it had.
func TestAClaimWhoseReplyWasLostLeavesNoGhost(t *testing.T) {
	ns, proxy, via := proxied(t)
	lossy := ns.OpenClient("lossy", backends.Client{Via: via})
	other := ns.Open("other")

	at := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	fresh, again := claim.Run{Job: "job.lost-reply", At: at}, claim.Run{Job: "job.lost-reply", At: at.Add(time.Minute)}
	// again's first attempt was handed back: claiming it is a takeover.
	first, err := claim.ClaimOne(t.Context(), other, again, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := claim.ReleaseOne(t.Context(), other, first, claim.Interrupted); err != nil {
		t.Fatal(err)
	}

	lose := func(reply []byte, runs []claim.Run) {
		t.Helper()
		before := proxy.Stats().Dropped
		proxy.DropReplies(1, func(b []byte) bool { return bytes.Contains(b, reply) })
		cls, errs := lossy.Claim(t.Context(), runs, time.Minute)
		for k, err := range errs {
			if !errors.Is(err, claim.ErrUnavailable) || cls[k] != nil {
				t.Fatalf("claim of %s with its reply lost: %v, %v; want ErrUnavailable and no claim", runs[k].ID(), cls[k], err)
			}
		}
		if got := proxy.Stats().Dropped - before; got != 1 {
			t.Fatalf("the proxy dropped %d replies matching %q, want 1", got, reply)
		}
	}
	later := claim.Run{Job: "job.lost-reply", At: at.Add(time.Hour)}
	// A batch: its insert granted both, and its reply's command tag says
	// so (a row per grant, and the stamp's).
	lose([]byte("SELECT 3"), []claim.Run{fresh, later})
	// Alone: the takeover granted again. Its reply is a row of six
	// columns, the first true (binary); the claimer's look at its
	// partitions, on a connection of its own, answers SELECT 1 too.
	lose([]byte("\x00\x06\x00\x00\x00\x01\x01"), []claim.Run{again})

	for _, run := range []claim.Run{fresh, later, again} {
		// The hand-back goes on its own goroutine: within moments, not
		// the lease's minute.
		cl, err := claimtest.ClaimWhenFreed(t, other, run, time.Minute)
		if err != nil {
			t.Fatalf("%s after a claim whose reply was lost: %v, want granted within moments", run.ID(), err)
		}
		want := 1
		if run == again {
			want = 2
		}
		if cl.Attempt != want {
			t.Errorf("%s granted as attempt %d, want %d: the lost grant's own", run.ID(), cl.Attempt, want)
		}
	}
}

// TestAnIdleConnectionCostsNoPing: pgxpool pings a connection idle for
// more than a second before it hands it out, a round trip more on nearly
// every claim and renewal of a replica (they come seconds apart); on a
// slow link that put claims past their timeout and releases past the
// lease. The claimer's pools ping only after a minute: a claim and a
// renewal after two seconds' idleness send one request each.
func TestAnIdleConnectionCostsNoPing(t *testing.T) {
	ns, proxy, via := proxied(t)
	a := ns.OpenClient("replica-a", backends.Client{Via: via, MaxConns: 1})
	at := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	// One connection each in the main pool and the lease pool, warm.
	cl, err := claim.ClaimOne(t.Context(), a, claim.Run{Job: "job.idle", At: at}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Renew(t.Context(), cl, time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // idle past pgxpool's default

	var mu sync.Mutex
	var requests [][]byte
	proxy.DropRequests(1<<30, func(b []byte) bool { // counts, drops nothing
		mu.Lock()
		defer mu.Unlock()
		requests = append(requests, bytes.Clone(b))
		return false
	})
	if err := a.Renew(t.Context(), cl, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := claim.ClaimOne(t.Context(), a, claim.Run{Job: "job.idle", At: at.Add(time.Minute)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	proxy.DropRequests(0, nil)
	mu.Lock()
	defer mu.Unlock()
	if len(requests) != 2 {
		t.Errorf("a renewal and a claim on idle connections sent %d requests, want 2:", len(requests))
		for _, r := range requests {
			t.Logf("  %q", r)
		}
	}
}

// TestAClaimWhoseReplyAndHandBackWereLostIsGrantedToItsNextTry: the
// insert granted, its reply was lost, and so was every try of the
// hand-back (a server that answers none of them). The grant is this
// replica's: its next claim of the run takes it at once, as the same
// attempt, where it would be held off by its own ghost for the lease;
// another replica is still held off (claimtest.NextTryTakesItsLostGrant).
func TestAClaimWhoseReplyAndHandBackWereLostIsGrantedToItsNextTry(t *testing.T) {
	ns, proxy, via := proxied(t)
	lossy := ns.OpenClient("lossy", backends.Client{Via: via})
	other := ns.Open("other")
	at := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	runs := []claim.Run{{Job: "job.unseen", At: at}, {Job: "job.unseen", At: at.Add(time.Minute)}}

	// The hand-back's statement, parsed anew on each connection it tries.
	proxy.DropRequests(100, func(b []byte) bool { return bytes.Contains(b, []byte("token = ''")) })
	proxy.DropReplies(1, func(b []byte) bool { return bytes.Contains(b, []byte("SELECT 3")) })
	if _, errs := lossy.Claim(t.Context(), runs, time.Minute); !errors.Is(errs[0], claim.ErrUnavailable) {
		t.Fatalf("claim with its reply lost: %v, want ErrUnavailable", errs[0])
	}
	postgres.WaitForHandBacks(lossy.Claimer)
	dropped := proxy.Stats().Dropped
	proxy.DropRequests(0, nil)
	if dropped < 2 {
		t.Fatalf("the proxy dropped %d chunks: want the claim's reply and the hand-back's tries", dropped)
	}
	for _, run := range runs {
		claimtest.NextTryTakesItsLostGrant(t, lossy, other, run)
	}
}
