package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/faultproxy"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestHistoryShowsALiveGrantOnlyAMinorityOfTheAnswersHold: a holder whose
// renewals reach only three of five nodes keeps its claim; a bid on the
// two nodes where its copy expired fails there and is aborted, leaving
// those nodes a more recent, interrupted record. A reader that cannot
// reach one of the holder's three nodes sees the grant on two nodes and
// the aborted bid on two: no grant has a majority of the answers. The run
// must still read as running, with the holder's fence, start and lease:
// the runner's overlap probe would otherwise start a later run beside it
// (explorer, redlock seed 105: a node restarted empty).
func TestHistoryShowsALiveGrantOnlyAMinorityOfTheAnswersHold(t *testing.T) {
	testenv.WallClock(t)
	ns := prepare(t, nil)
	servers := ns.Servers()
	via := map[string]string{}
	var proxies []*faultproxy.Proxy
	for _, s := range servers[3:] {
		p, err := faultproxy.New(s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		proxies, via[s] = append(proxies, p), p.Addr()
	}
	a := ns.OpenClient("replica-a", backends.Client{Via: via})
	b := ns.Open("replica-b")
	reader := ns.OpenClient("replica-c", backends.Client{Via: map[string]string{servers[0]: "127.0.0.1:1"}})

	const lease = time.Second
	run := runAt("job.minority", 0)
	cl, err := claim.ClaimOne(ctxT(t), a, run, lease)
	if err != nil {
		t.Fatal(err)
	}
	// The nodes share this machine's clock: every copy of a's grant was
	// stamped before the claim returned, a renewal's repair or b's bid
	// after it.
	claimed := time.Now()
	for _, p := range proxies {
		p.Partition(true)
	}
	// a renews on nodes 0-2 until its copies on nodes 3 and 4 expired.
	for until := time.Now().Add(lease + 200*time.Millisecond); time.Now().Before(until); {
		if err := a.Renew(ctxT(t), cl, lease); err != nil {
			t.Fatalf("renew on three of five nodes: %v", err)
		}
		time.Sleep(lease / 5) // a keep-alive's period
	}
	// b's bid wins nodes 3 and 4 only, and is aborted there.
	if _, err := claim.ClaimOne(ctxT(t), b, run, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("bid while a holds three nodes: %v, want ErrHeld", err)
	}
	recs, err := reader.History(ctxT(t), run.Job, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("history: %+v, want the one run", recs)
	}
	r := recs[0]
	switch {
	case r.Status != claim.Running:
		t.Fatalf("history says %s (fence %d, holder %s), want running: a holds the run", r.Status, r.Fence, r.Holder)
	case r.Fence != cl.Fence:
		t.Fatalf("history says fence %d, want a's %d", r.Fence, cl.Fence)
	case r.LeaseUntil.Before(cl.Deadline):
		t.Fatalf("history says the lease ends at %s, before a's deadline %s", r.LeaseUntil, cl.Deadline)
	case r.StartedAt.After(claimed):
		t.Fatalf("history says the run started at %s, after a's claim returned at %s", r.StartedAt, claimed)
	}
}
