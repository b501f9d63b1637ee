package runner

import (
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// The overlap probe counts the runs this replica executes even where the
// page of history it read does not list them (a taken-over run buried
// behind runs that ended, explorer seed 61163): each is added once, live,
// placed by its grant; a listed one is not added again, the probing run
// never, and a run that ended here no longer.
func TestTheProbeCountsRunsHeldHereThatThePageMisses(t *testing.T) {
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	j := &jobState{Job: Job{Name: "queue"}, live: map[int64][2]int{}, held: map[string]heldRun{}}
	run := func(sec int) claim.Run { return claim.Run{Job: "queue", At: t0.Add(time.Duration(sec) * time.Second)} }
	buried := &claim.Claim{Run: run(2), Holder: "r2", Fence: 13, Attempt: 3}
	listed := &claim.Claim{Run: run(8), Holder: "r2", Fence: 14, Attempt: 1}
	probing := &claim.Claim{Run: run(10), Holder: "r2", Fence: 15, Attempt: 2}
	grantedAt := t0.Add(21600 * time.Millisecond)
	_, dropBuried := j.hold(buried, grantedAt, 0)
	listedTrust, dropListed := j.hold(listed, grantedAt, 0)
	defer dropListed()
	_, dropProbing := j.hold(probing, grantedAt.Add(55*time.Millisecond), 0)
	defer dropProbing()

	page := []claim.Record{
		{RunID: run(12).ID(), Job: "queue", At: run(12).At, Status: claim.Succeeded},
		{RunID: listed.ID(), Job: "queue", At: listed.Run.At, Status: claim.Running, Fence: 14, LeaseUntil: t0.Add(time.Minute)},
	}
	got := withHeldHere(page, j, probing)
	if len(got) != 3 {
		t.Fatalf("got %d records, want the page's 2 and the buried run held here: %+v", len(got), got)
	}
	add := got[2]
	if add.RunID != buried.ID() || add.Status != claim.Running || add.Fence != 13 || !add.StartedAt.Equal(grantedAt) ||
		!add.LeaseUntil.After(t0.Add(100*365*24*time.Hour)) {
		t.Fatalf("added %+v, want %s running, fence 13, started at its grant, its lease held", add, buried.ID())
	}
	dropBuried()
	if got := withHeldHere(page, j, probing); len(got) != 2 {
		t.Fatalf("after the buried run ended here: %d records, want the page's 2", len(got))
	}

	// The listed run's record shows its lease lapsed (a server gone back
	// to an older copy): it is live while this replica trusts its lease,
	// and as its record says once it no longer does.
	lapsed := page[1].LeaseUntil
	until := time.Now().Add(time.Minute)
	listedTrust.Store(&until)
	if got := withHeldHere(page, j, probing); !got[1].LeaseUntil.After(t0.Add(100 * 365 * 24 * time.Hour)) {
		t.Fatalf("the listed run held here, its lease trusted: lease until %v, want held", got[1].LeaseUntil)
	}
	if !page[1].LeaseUntil.Equal(lapsed) {
		t.Fatalf("the page, shared, was changed: lease until %v", page[1].LeaseUntil)
	}
	listedTrust.Store(nil)
	if got := withHeldHere(page, j, probing); !got[1].LeaseUntil.Equal(lapsed) {
		t.Fatalf("the listed run held here, its lease no longer trusted: lease until %v, want the record's %v", got[1].LeaseUntil, lapsed)
	}
}
