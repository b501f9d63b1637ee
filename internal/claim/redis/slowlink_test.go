package redis_test

import (
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// TestASlowLinkKeepsItsConnections: over a link of 900ms round trips, a
// claimer that claims on a 3s lease and releases keeps the connections it
// has. The done watcher's looks were bounded by lease/4 (750ms, and 50ms
// before a claimer's first claim): none came back in time, each closed its
// connection, and the next dialled anew (a HELLO round trip first) and
// timed out again, twenty connections a second; every timeout held
// takeovers back, and releases and renewals on the same client, dialling
// too, took two round trips and missed a lease (TestFaults' "latency
// 450ms each way", stop 69).
func TestASlowLinkKeepsItsConnections(t *testing.T) {
	proxy, slow, _ := lossyPair(t)
	proxy.SetLatency(450 * time.Millisecond)
	const lease = 3 * time.Second
	for i := range 3 {
		run := claim.Run{Job: "job.slow-link", At: base.Add(time.Duration(i) * time.Minute)}
		cl, err := claim.ClaimOne(ctxT(t), slow, run, lease)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.ReleaseOne(ctxT(t), slow, cl, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // the watcher looks, every lease/4
	}
	if n := proxy.Stats().Accepted; n > 3 {
		t.Errorf("%d connections over the slow link for 3 claims and releases, want a few: looks that time out close theirs", n)
	}
	if slow.TakeoversHeld(lease) {
		t.Error("takeovers held over a link that answered every call")
	}
}
