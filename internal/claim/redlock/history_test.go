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

	// Long enough that a loaded machine renews well within it.
	const lease = 3 * time.Second
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
	// renew keeps a's claim on nodes 0-2; a round lost to a stalled
	// machine (ErrUnavailable) is retried while the lease lasts.
	renew := func() {
		t.Helper()
		err := a.Renew(ctxT(t), cl, lease)
		switch {
		case err == nil:
		case !errors.Is(err, claim.ErrUnavailable):
			t.Fatalf("renew on three of five nodes: %v", err)
		case time.Since(cl.Requested) > lease/2:
			t.Fatalf("a could not renew for half its lease: %v", err)
		}
	}
	// a renews until its copies on nodes 3 and 4 have expired.
	for until := time.Now().Add(lease + 200*time.Millisecond); time.Now().Before(until); {
		renew()
		time.Sleep(lease / 10) // a keep-alive's period
	}
	renew()
	// b's bid wins nodes 3 and 4 only, and is aborted there. A round that
	// timed out on a stalled machine is bid again.
	for {
		_, err := claim.ClaimOne(ctxT(t), b, run, lease)
		if errors.Is(err, claim.ErrHeld) {
			break
		}
		if !errors.Is(err, claim.ErrUnavailable) || time.Since(cl.Requested) > lease/2 {
			t.Fatalf("bid while a holds three nodes: %v, want ErrHeld", err)
		}
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
