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
	j := &jobState{Job: Job{Name: "queue"}, live: map[int64][2]int{}, held: map[string]claim.Record{}}
	run := func(sec int) claim.Run { return claim.Run{Job: "queue", At: t0.Add(time.Duration(sec) * time.Second)} }
	buried := &claim.Claim{Run: run(2), Holder: "r2", Fence: 13, Attempt: 3}
	listed := &claim.Claim{Run: run(8), Holder: "r2", Fence: 14, Attempt: 1}
	probing := &claim.Claim{Run: run(10), Holder: "r2", Fence: 15, Attempt: 2}
	grantedAt := t0.Add(21600 * time.Millisecond)
	dropBuried := j.hold(buried, grantedAt)
	defer j.hold(listed, grantedAt)()
	defer j.hold(probing, grantedAt.Add(55*time.Millisecond))()

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
}
