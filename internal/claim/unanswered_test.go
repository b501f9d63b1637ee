package claim

import (
	"errors"
	"testing"
	"time"
)

// TestTheHoldOnTakeoversLastsALeaseAfterAStall: a stall (calls
// unanswered, none answered) holds takeovers until the backend has
// answered again for a lease, however long it lasted, and however long
// after the last call that went unanswered in it.
func TestTheHoldOnTakeoversLastsALeaseAfterAStall(t *testing.T) {
	const lease = time.Second
	var u Unanswered
	at := func(d time.Duration) int64 { return int64(time.Hour + d) }
	if u.holdAt(lease, at(0)) {
		t.Fatal("held before any call went unanswered")
	}
	for d := time.Duration(0); d <= lease; d += lease / 4 { // calls unanswered in the first lease
		u.noteAt(at(d))
	}
	// Then nothing is asked until the stall ends, 20 leases on.
	answered := 20 * lease
	for _, d := range []time.Duration{answered, answered + lease/2, answered + lease - 1} {
		if !u.holdAt(lease, at(d)) {
			t.Fatalf("not held %v after a 20-lease stall began, %v after the backend answered again", d, d-answered)
		}
		u.answeredAt(at(d))
	}
	if u.holdAt(lease, at(answered+lease)) {
		t.Fatal("still held a lease after the backend answered again")
	}
}

// TestTheHoldOnTakeoversEndsWhenTheBackendKeepsAnswering: a backend that
// leaves a call unanswered every half lease while it answers the others
// holds takeovers for ChronicAfter leases of answers, not forever; a
// lease without unanswered calls ends the streak, and the next stall is
// held again.
func TestTheHoldOnTakeoversEndsWhenTheBackendKeepsAnswering(t *testing.T) {
	const lease = time.Second
	var u Unanswered
	at := func(d time.Duration) int64 { return int64(time.Hour + d) }
	u.holdAt(lease, at(0))
	end := time.Duration(0)
	for d := time.Duration(0); d < 10*lease; d += lease / 2 {
		u.noteAt(at(d))
		answered := d + lease/4
		u.answeredAt(at(answered))
		held := u.holdAt(lease, at(answered))
		if want := answered-lease/4 < ChronicAfter*lease; held != want {
			t.Fatalf("%v into the streak: held %v, want %v", answered, held, want)
		}
		end = d
	}
	// A lease and more with every call answered ends the streak.
	for d := end + lease/2; d < end+2*lease; d += lease / 4 {
		u.answeredAt(at(d))
	}
	stall := end + 2*lease
	u.noteAt(at(stall))
	u.answeredAt(at(stall + lease/2))
	if !u.holdAt(lease, at(stall+lease/2)) {
		t.Fatal("a stall after the chronic streak ended was not held")
	}
}

// TestALongStallSoonAfterAShortOneIsHeldWhole: a short stall, a moment of
// answers, then, within a lease, a long one (a failover after a hiccup):
// one streak with one answer in it, not a backend that keeps answering.
// Its hold lasts until a lease after the long stall ends. (Measured as
// time since the streak's first answer, the cap ended it three leases
// in, and the explorer's sweep saw a run whose handler had returned nil
// run again the moment the backend came back: 2 of 2,000 seeds.)
func TestALongStallSoonAfterAShortOneIsHeldWhole(t *testing.T) {
	const lease = time.Second
	var u Unanswered
	at := func(d time.Duration) int64 { return int64(time.Hour + d) }
	u.holdAt(lease, at(0))
	u.noteAt(at(0)) // the short stall
	u.answeredAt(at(lease / 2))
	for d := lease / 2; d <= 8*lease; d += lease / 4 { // the long one: every call unanswered
		u.noteAt(at(d + lease/8))
		if !u.holdAt(lease, at(d+lease/8)) {
			t.Fatalf("not held %v into a stall with one answer in it", d)
		}
	}
	back := 8*lease + lease/2
	u.answeredAt(at(back))
	if !u.holdAt(lease, at(back+lease-1)) {
		t.Fatal("not held within a lease after the long stall ended")
	}
	if u.holdAt(lease, at(back+lease)) {
		t.Fatal("still held a lease after the backend answered again")
	}
}

// TestARefusalHoldsTakeoversUntilAWriteLands: a backend that refuses
// writes answers everything else. Those answers (a bid for a run held or
// done, which writes nothing) must not end the hold, by its lease nor by
// its chronic cap, however long the refusal lasts: only a write that
// lands does, and the hold then lasts a lease from it. Readiness sees the
// refusal until then.
func TestARefusalHoldsTakeoversUntilAWriteLands(t *testing.T) {
	const lease = time.Second
	var u Unanswered
	at := func(d time.Duration) int64 { return int64(time.Hour + d) }
	full := errors.New("disk full")
	u.holdAt(lease, at(0))
	u.refusedAt(full, at(0))
	for d := lease / 4; d < 10*lease; d += lease / 4 { // answers that wrote nothing
		u.answeredAt(at(d))
		if !u.holdAt(lease, at(d)) {
			t.Fatalf("not held %v into a refusal, answered but nothing written", d)
		}
		if d%(2*lease) == 0 {
			u.refusedAt(full, at(d)) // a retried release, refused again
		}
	}
	if err := u.Refusal(time.Minute); !errors.Is(err, full) {
		t.Fatalf("readiness during the refusal: %v, want %v", err, full)
	}
	if err := u.Refusal(0); err != nil {
		t.Fatalf("a refusal older than the window reported: %v", err)
	}
	landed := 10 * lease
	u.landedAt(at(landed))
	if err := u.Refusal(time.Minute); err != nil {
		t.Fatalf("readiness after a write landed: %v", err)
	}
	if !u.holdAt(lease, at(landed+lease-1)) {
		t.Fatal("not held within a lease after the first write landed")
	}
	u.answeredAt(at(landed + lease/2)) // answers count again
	if u.holdAt(lease, at(landed+lease)) {
		t.Fatal("still held a lease after writes landed again")
	}
}

// TestANewClaimerHoldsTakeoversUntilAnsweredForALease: Start holds
// takeovers however long the first answer takes (a process begun inside
// a stall hears it as the stall ends), and until a lease after it;
// Settle ends the hold at once.
func TestANewClaimerHoldsTakeoversUntilAnsweredForALease(t *testing.T) {
	const lease = time.Second
	at := func(d time.Duration) time.Time { return time.Unix(0, int64(time.Hour+d)) }
	var u Unanswered
	u.StartAt(at(0))
	firstAnswer := 30 * lease // the stall it began in ends
	for _, d := range []time.Duration{0, lease, firstAnswer - 1} {
		if !u.HoldAt(lease, at(d)) {
			t.Fatalf("not held %v after the start, before any answer", d)
		}
	}
	for _, d := range []time.Duration{firstAnswer, firstAnswer + lease/2, firstAnswer + lease - 1} {
		u.AnsweredAt(at(d))
		if !u.HoldAt(lease, at(d)) {
			t.Fatalf("not held %v after the first answer", d-firstAnswer)
		}
	}
	if u.HoldAt(lease, at(firstAnswer+lease)) {
		t.Fatal("still held a lease after the first answer")
	}

	var s Unanswered
	s.StartAt(at(0))
	s.Settle()
	if s.HoldAt(lease, at(0)) {
		t.Fatal("held after Settle")
	}
}
