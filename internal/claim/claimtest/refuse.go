package claimtest

import (
	"errors"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// RefusedWritesHoldTakeovers checks a claimer's hold on takeovers while
// its backend answers but refuses every write (refuse(true) until
// refuse(false): a full disk, a database gone read-only, etcd's NOSPACE).
// holder claims two runs under lease; during the refusal the handler of
// one has returned, but its release is refused, and the lease lapses.
// Once writes land again, standby's bid must be held until the holder's
// retried release lands, however long the refusal lasted: its bids for a
// run still leased, which may write nothing and succeed meanwhile, must
// not end the hold by its chronic cap. Before, PostgreSQL held nothing
// and etcd counted the refusal as an answer, and a standby ran a
// finished run again (outside reviews: 15 runs in 8 of 8 tries on
// PostgreSQL, 6 of 18 on etcd). The run of a holder that died is still
// taken over, once writes have landed for a lease. Readiness reports the
// refusal, which a probe that writes nothing would not meet.
func RefusedWritesHoldTakeovers(t *testing.T, holder, standby claim.Claimer, refuse func(on bool), lease time.Duration) {
	t.Helper()
	Settle(holder, standby)
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	finished, dead := claim.Run{Job: "job.refused", At: at}, claim.Run{Job: "job.refused", At: at.Add(time.Minute)}
	leased := claim.Run{Job: "job.refused", At: at.Add(2 * time.Minute)}
	cls, errs := holder.Claim(ctxT(t), []claim.Run{finished, dead}, lease)
	for k, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", k, err)
		}
	}
	if _, err := claim.ClaimOne(ctxT(t), holder, leased, time.Hour); err != nil {
		t.Fatal(err)
	}
	// What the claimer says of its hold, which the runner logs and
	// exports, is what it does.
	held := func(want bool, when string) {
		t.Helper()
		if th, ok := standby.(claim.TakeoverHolder); ok && th.TakeoversHeld(lease) != want {
			t.Fatalf("%s: the standby says takeovers held: %v, want %v", when, !want, want)
		}
	}
	held(false, "before the refusal")

	refuse(true)
	resumed := false
	defer func() {
		if !resumed {
			refuse(false)
		}
	}()
	if err := claim.ReleaseOne(ctxT(t), holder, cls[0], claim.Succeeded); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("the holder's release while writes are refused: %v, want unavailable (the backend refuses nothing)", err)
	}
	// The standby's bids meet the refusal from the start, as a busy
	// replica's do: a new run's claim is refused.
	if _, err := claim.ClaimOne(ctxT(t), standby, claim.Run{Job: "job.other", At: at}, lease); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("a new run's claim while writes are refused: %v, want unavailable", err)
	}
	held(true, "after a refused write")
	if err := standby.Ping(ctxT(t)); !errors.Is(err, claim.ErrUnavailable) {
		t.Errorf("readiness while writes are refused: %v, want the refusal", err)
	}
	// Past the lease, and through more than ChronicAfter leases of bids
	// for the lapsed run and for the run still leased.
	for end := time.Now().Add(lease + (claim.ChronicAfter+1)*lease + lease/2); time.Now().Before(end); time.Sleep(lease / 10) {
		for _, run := range []claim.Run{finished, leased} {
			if cl, err := claim.ClaimOne(ctxT(t), standby, run, lease); err == nil {
				t.Fatalf("%s granted to the standby while writes are refused: %+v", run.ID(), cl)
			}
		}
	}
	held(true, "after more than ChronicAfter leases of refused writes")

	refuse(false)
	resumed = true
	if _, err := claim.ClaimOne(ctxT(t), standby, finished, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("the standby's bid as writes land again: %v, want held: the holder's release has not landed yet", err)
	}
	if err := claim.ReleaseOne(ctxT(t), holder, cls[0], claim.Succeeded); err != nil {
		t.Fatalf("the holder's retried release: %v, want it to land", err)
	}
	if _, err := claim.ClaimOne(ctxT(t), standby, finished, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("the standby after the release: %v, want done", err)
	}
	if err := standby.Ping(ctxT(t)); err != nil {
		t.Errorf("readiness once writes land: %v", err)
	}
	// The standby's only writes now are its bids for the dead holder's
	// run, held: a lease after they land, the run is taken over.
	cl, err := ClaimWhenFreed(t, standby, dead, lease)
	if err != nil || cl.Attempt != 2 {
		t.Fatalf("the run of a holder that died during the refusal: %v, %v; want taken over, attempt 2", cl, err)
	}
	held(false, "once the dead holder's run was taken over")
}
