package postgres_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimtest"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// TestRefusedWritesHoldTakeoversUntilWritesLand: while the server refuses
// every write (a full disk: SQLSTATE 53100, raised here by a trigger on
// every row written, as a server out of space refuses each write that
// needs a page and passes statements that write nothing), a holder whose
// handler returned cannot release, and its lease lapses. When writes land
// again, the standby's bid must be held until the holder's retried
// release lands, however long the refusal lasted; its bids for a run still
// leased, which write nothing and succeed meanwhile, must not end the
// hold by its chronic cap. Before, the first write to land decided, and
// the standby's bid, sent more often, ran a finished run again (an
// outside review: 15 runs in 8 of 8 disk fills and read-only switches).
// A dead holder's run is still taken over, once writes have landed for a
// lease; and readiness reports the refusal, which its probe, writing
// nothing, would not meet.
func TestRefusedWritesHoldTakeoversUntilWritesLand(t *testing.T) {
	const lease = time.Second
	ns := backends.Prepare(t, "postgres", backends.Options{})
	holder, standby := ns.Open("holder"), ns.Open("standby")
	set, err := backends.RefuseWrites(t.Context(), holder.DB)
	if err != nil {
		t.Fatal(err)
	}
	refuse := func(on bool) {
		t.Helper()
		if err := set(t.Context(), on); err != nil {
			t.Fatal(err)
		}
	}

	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	finished, dead := claim.Run{Job: "job.refused", At: at}, claim.Run{Job: "job.refused", At: at.Add(time.Minute)}
	leased := claim.Run{Job: "job.refused", At: at.Add(2 * time.Minute)}
	cls, errs := holder.Claim(t.Context(), []claim.Run{finished, dead}, lease)
	for k, err := range errs {
		if err != nil {
			t.Fatalf("claim %d: %v", k, err)
		}
	}
	if _, err := claim.ClaimOne(t.Context(), holder, leased, time.Hour); err != nil {
		t.Fatal(err)
	}
	held := func(want bool, when string) {
		t.Helper()
		// What the claimer says of its hold, which the runner logs and
		// exports, is what it does.
		if th, ok := standby.Claimer.(claim.TakeoverHolder); ok && th.TakeoversHeld(lease) != want {
			t.Fatalf("%s: the standby says takeovers held: %v, want %v", when, !want, want)
		}
	}
	held(false, "before the refusal")

	refuse(true)
	if err := claim.ReleaseOne(t.Context(), holder, cls[0], claim.Succeeded); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("the holder's release while writes are refused: %v, want unavailable (the trigger refuses nothing)", err)
	}
	// The standby's bids meet the refusal from the start, as a busy
	// replica's do: a new run's insert is refused.
	if _, err := claim.ClaimOne(t.Context(), standby, claim.Run{Job: "job.other", At: at}, lease); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("a new run's claim while writes are refused: %v, want unavailable", err)
	}
	held(true, "after a refused write")
	if err := standby.Ping(t.Context()); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("readiness while writes are refused: %v, want the refusal", err)
	}
	// Past the lease, and through more than ChronicAfter leases: bids for
	// the lapsed run are refused (held back, they write its row
	// unchanged, which the refusal meets too), and bids for the run still
	// leased succeed, writing nothing.
	for end := time.Now().Add(lease + (claim.ChronicAfter+1)*lease + lease/2); time.Now().Before(end); time.Sleep(lease / 10) {
		for _, run := range []claim.Run{finished, leased} {
			if cl, err := claim.ClaimOne(t.Context(), standby, run, lease); err == nil {
				t.Fatalf("%s granted to the standby while writes are refused: %+v", run.ID(), cl)
			}
		}
	}
	held(true, "after more than ChronicAfter leases of refused writes")

	refuse(false)
	if _, err := claim.ClaimOne(t.Context(), standby, finished, lease); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("the standby's bid as writes land again: %v, want held: the holder's release has not landed yet", err)
	}
	if err := claim.ReleaseOne(t.Context(), holder, cls[0], claim.Succeeded); err != nil {
		t.Fatalf("the holder's retried release: %v, want it to land", err)
	}
	if _, err := claim.ClaimOne(t.Context(), standby, finished, lease); !errors.Is(err, claim.ErrDone) {
		t.Fatalf("the standby after the release: %v, want done", err)
	}
	if err := standby.Ping(t.Context()); err != nil {
		t.Errorf("readiness once writes land: %v", err)
	}
	// The standby's only writes now are its held bids for the dead
	// holder's run: they land, and a lease later the run is taken over.
	cl, err := claimtest.ClaimWhenFreed(t, standby, dead, lease)
	if err != nil || cl.Attempt != 2 {
		t.Fatalf("the run of a holder that died during the refusal: %v, %v; want taken over, attempt 2", cl, err)
	}
	held(false, "once the dead holder's run was taken over")
}
