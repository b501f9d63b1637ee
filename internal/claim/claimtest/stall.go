package claimtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// LapsedInAStallIsNotTakenOver checks a claimer's hold on takeovers after
// its backend left its calls unanswered (claim.Unanswered). holder claims
// two runs under lease; the backend stalls (stall, until resume) for
// longer than the lease, while standby's calls go unanswered, as a busy
// replica's do. When it resumes, the leases have lapsed, but their holder
// could neither renew nor release: standby is held off, and the holder's
// release lands (an outside review: 286–297 of 300 runs ran again after a
// 6–15s Redis stop, their handlers done, their releases waiting). The
// run of a holder that died meanwhile is still taken over, once standby
// has heard the backend answer for a lease.
func LapsedInAStallIsNotTakenOver(t *testing.T, holder, standby claim.Claimer, stall, resume func(), lease time.Duration) {
	t.Helper()
	finished := claim.Run{Job: "job.stalled", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	dead := claim.Run{Job: "job.stalled", At: finished.At.Add(time.Minute)}
	cls, errs := holder.Claim(ctxT(t), []claim.Run{finished, dead}, lease)
	for k, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", k, err)
		}
	}
	stall()
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	unanswered := func(run claim.Run) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
		defer cancel()
		if _, err := claim.ClaimOne(ctx, standby, run, lease); err == nil {
			t.Fatal("a claim on a stalled backend was granted")
		}
	}
	// Busy, as a replica with due runs is: its calls go unanswered from
	// the start. (One that sends nothing until its bid for a lapsed lease
	// does not know to hold back: docs/hardening.md.)
	unanswered(claim.Run{Job: "job.other", At: finished.At})
	time.Sleep(lease) // every lease lapses, by the backend's clock too
	unanswered(finished)
	resume()
	resumed = true
	if _, err := claim.ClaimOne(ctxT(t), standby, finished, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("the standby's bid as the backend resumes: %v, want held: the holder may have finished", err)
	}
	if err := claim.ReleaseOne(ctxT(t), holder, cls[0], claim.Succeeded); err != nil {
		t.Fatalf("the holder's release after the stall: %v, want it to land", err)
	}
	if _, err := claim.ClaimOne(ctxT(t), standby, finished, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("the standby after the release: %v, want done", err)
	}
	cl, err := ClaimWhenFreed(t, standby, dead, lease)
	if err != nil || cl.Attempt != 2 {
		t.Fatalf("the run of a holder that died during the stall: %v, %v; want taken over, attempt 2", cl, err)
	}
}
