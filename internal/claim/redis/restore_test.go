package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// TestDoneLogRemembersTerminalReleasesWithinItsBounds: only terminal
// releases that succeeded are remembered, none older than DoneTTL and no
// more than maxRemembered, newest kept.
func TestDoneLogRemembersTerminalReleasesWithinItsBounds(t *testing.T) {
	d := newDoneLog(nil, time.Hour)
	d.start.Do(func() {}) // no watcher: there is no server here
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	cl := func(i int) *claim.Claim {
		return &claim.Claim{Run: claim.Run{Job: "job", At: at.Add(time.Duration(i) * time.Second)}, Token: "t", Holder: "a"}
	}
	d.released([]*claim.Claim{cl(0), cl(1), cl(2), cl(3)},
		[]claim.Status{claim.Succeeded, claim.Interrupted, claim.Failed, claim.Succeeded},
		[]error{nil, nil, nil, errors.New("lost")})
	got := d.recent()
	if len(got) != 2 || got[0].Run != cl(0).Run || got[1].Run != cl(2).Run || got[1].Status != claim.Failed {
		t.Fatalf("remembered %+v, want runs 0 (succeeded) and 2 (failed) only", got)
	}

	// A run found done is remembered too, once, whoever finished it.
	seen := func(i int, status claim.Status) redisnode.Finished {
		return redisnode.Finished{Run: cl(i).Run, Status: status, Holder: "b", Fence: 7, Attempt: 2, At: time.Now()}
	}
	d.add([]redisnode.Finished{seen(2, claim.Failed), seen(5, claim.Skipped)})
	d.add([]redisnode.Finished{seen(5, claim.Skipped)})
	got = d.recent()
	if len(got) != 3 || got[2].Run != cl(5).Run || got[2].Holder != "b" || got[2].Fence != 7 || got[2].Attempt != 2 {
		t.Fatalf("remembered %+v, want runs 0, 2 and, once, 5 as found done", got)
	}

	// Past DoneTTL: forgotten.
	d.mu.Lock()
	for i := range d.runs {
		d.runs[i].At = d.runs[i].At.Add(-2 * time.Hour)
	}
	d.mu.Unlock()
	if got := d.recent(); len(got) != 0 {
		t.Fatalf("remembered %d releases older than DoneTTL, want none", len(got))
	}

	// Beyond maxRemembered: the oldest go.
	for i := range maxRemembered + 10 {
		d.released([]*claim.Claim{cl(i)}, []claim.Status{claim.Succeeded}, []error{nil})
	}
	got = d.recent()
	if len(got) != maxRemembered || got[0].Run != cl(10).Run || got[len(got)-1].Run != cl(maxRemembered+9).Run {
		t.Fatalf("remembered %d releases from %v to %v, want the newest %d", len(got), got[0].Run.At, got[len(got)-1].Run.At, maxRemembered)
	}
	d.close()
}
