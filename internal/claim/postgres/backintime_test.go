package postgres_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestADatabaseThatWentBackInTimeIsNotClaimedFrom: fences come from one
// sequence and only grow. A database restored from a backup under running
// replicas, or another server answering the same DSN, hands out fences
// below ones a replica saw granted, and may grant runs some replica still
// runs (an outside review: runs executed twice after a restore, and on a
// multi-host DSN over two servers). A replica that sees a fence come out
// at or below one it saw before its request stops claiming for good, and
// says why; `scheduler run` exits 1 on Lost.
func TestADatabaseThatWentBackInTimeIsNotClaimedFrom(t *testing.T) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	at := time.Date(2026, 5, 6, 7, 0, 0, 0, time.UTC)
	run := func(i int) claim.Run {
		return claim.Run{Job: "job.restored", At: at.Add(time.Duration(i) * time.Minute)}
	}
	for _, batch := range []bool{false, true} {
		b := ns.Open("replica")
		var high int64
		for i := range 3 {
			cl, err := claim.ClaimOne(t.Context(), b.Claimer, run(i+btoi(batch)*100), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			high = max(high, cl.Fence)
		}
		// Restored from a backup taken before the last grants.
		if _, err := b.DB.ExecContext(t.Context(), "SELECT setval('scheduler_fence_seq', $1)", high-2); err != nil {
			t.Fatal(err)
		}
		select {
		case <-b.Lost:
			t.Fatal("lost before any grant after the restore")
		default:
		}
		runs := []claim.Run{run(50 + btoi(batch)*100)}
		if batch {
			runs = append(runs, run(51+100))
		}
		cls, errs := b.Claimer.Claim(t.Context(), runs, time.Minute)
		for i := range runs {
			if cls[i] != nil || !errors.Is(errs[i], claim.ErrUnavailable) || !strings.Contains(errs[i].Error(), "went back in time") {
				t.Fatalf("batch %v: claim after the restore: %+v, %v; want refused, the database gone back in time", batch, cls[i], errs[i])
			}
		}
		select {
		case <-b.Lost:
		default:
			t.Fatal("Lost not closed")
		}
		if err := b.LostErr(); err == nil || !strings.Contains(err.Error(), "claims nothing more") {
			t.Fatalf("LostErr: %v", err)
		}
		if _, err := claim.ClaimOne(t.Context(), b.Claimer, run(60+btoi(batch)*100), time.Minute); !errors.Is(err, claim.ErrUnavailable) {
			t.Fatalf("a later claim: %v, want refused", err)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
