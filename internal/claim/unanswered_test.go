package claim

import (
	"testing"
	"time"
)

// TestTheHoldOnTakeoversLastsALeaseAfterAStall: a stall (calls
// unanswered, none answered) holds takeovers for a lease after its last
// unanswered call, however long it lasted.
func TestTheHoldOnTakeoversLastsALeaseAfterAStall(t *testing.T) {
	const lease = time.Second
	var u Unanswered
	at := func(d time.Duration) int64 { return int64(time.Hour + d) }
	if u.holdAt(lease, at(0)) {
		t.Fatal("held before any call went unanswered")
	}
	for d := time.Duration(0); d <= 20*lease; d += lease / 4 { // a 20-lease stall
		u.noteAt(at(d))
	}
	for _, d := range []time.Duration{20*lease + lease/10, 20*lease + lease/2, 21*lease - 1} {
		if !u.holdAt(lease, at(d)) {
			t.Fatalf("not held %v after a 20-lease stall began, %v after it ended", d, d-20*lease)
		}
		u.answeredAt(at(d)) // the backend answers again
	}
	if u.holdAt(lease, at(21*lease)) {
		t.Fatal("still held a lease after the last unanswered call")
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
