package history

import (
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// A grant whose reply came back late, after its lease had lapsed and a
// takeover's reply had come back first, is ordered by the backend (its
// lower fence), not by when the replies arrived: no overlap. Found on
// redlock with a loaded replica (real nemesis seed 101).
func TestLateReplyIsOrderedByFence(t *testing.T) {
	b := newBuilder()
	// a asked at 0 and was granted fence 1; its reply is logged at 1.3s.
	lateA := Event{Kind: Grant, Replica: "a", Run: runA, Token: "ta", Fence: 1, Attempt: 1, Sent: b.t0, Until: b.t0.Add(lease)}
	// b asked at 1.2s, after a's lease lapsed, and took over with fence 2.
	b.at(1250 * time.Millisecond).add(Event{Kind: Grant, Replica: "b", Run: runA, Token: "tb", Fence: 2, Attempt: 2,
		Sent: b.t0.Add(1200 * time.Millisecond), Until: b.t0.Add(2200 * time.Millisecond)})
	b.at(1300 * time.Millisecond).add(lateA)
	b.finish("b", "tb", runA, claim.Succeeded)
	if vs := Check(b.evs, Spec{}); has(vs, GrantOverlap) {
		t.Errorf("a late reply of an expired grant was judged an overlap: %v", vs)
	}

	// Time still decides where it can: a grant asked for after another's
	// reply came back is later, whatever its fence says.
	b = newBuilder().grant("a", "ta", runA, 5, 1)
	b.at(300*time.Millisecond).grant("b", "tb", runA, 2, 2)
	if vs := Check(b.evs, Spec{}); !has(vs, GrantOverlap) {
		t.Errorf("a grant inside a live lease, asked for after it, was not judged (fence lower): %v", vs)
	}
	// And two grants in flight together, fences in order, within the
	// first's lease: an overlap.
	b = newBuilder()
	b.at(10 * time.Millisecond).add(Event{Kind: Grant, Replica: "b", Run: runA, Token: "tb", Fence: 2, Attempt: 2,
		Sent: b.t0, Until: b.t0.Add(lease)})
	b.at(20 * time.Millisecond).add(Event{Kind: Grant, Replica: "a", Run: runA, Token: "ta", Fence: 1, Attempt: 1,
		Sent: b.t0, Until: b.t0.Add(lease)})
	if vs := Check(b.evs, Spec{}); !has(vs, GrantOverlap) {
		t.Errorf("two concurrent grants of one run were not judged: %v", vs)
	}
}

// A holder that skipped its run for good, whose terminal release each
// time reached only a minority before it crashed, ended the run if
// replicas were then told "done"; without that word it is abandoned.
func TestDecidedEndSeenDoneIsEnded(t *testing.T) {
	abandoned := func(seenDone bool) bool {
		b := newBuilder().grant("a", "ta", runA, 1, 1)
		b.event(Skip, "a", "ta", runA, func(e *Event) { e.Reason = "missed" })
		if seenDone {
			b.at(2*time.Second).event(Skip, "b", "", runA, func(e *Event) { e.Reason = "done" })
		}
		return has(Check(b.evs, Spec{Settled: b.t0.Add(5 * time.Second)}), Abandoned)
	}
	if abandoned(true) {
		t.Error("a skipped run that replicas saw done was judged abandoned")
	}
	if !abandoned(false) {
		t.Error("a skipped run never released nor seen done was not judged abandoned")
	}
	// "done" with no holder having decided an end is no evidence.
	b := newBuilder().grant("a", "ta", runA, 1, 1)
	b.event(Start, "a", "ta", runA, nil)
	b.at(2*time.Second).event(Skip, "b", "", runA, func(e *Event) { e.Reason = "done" })
	if !has(Check(b.evs, Spec{Settled: b.t0.Add(5 * time.Second)}), Abandoned) {
		t.Error("a run whose handler never returned was judged ended on a done reply alone")
	}
}

// A holder whose handler returned and whose release was sent but not
// confirmed (on redlock it landed on a minority, which then granted a
// takeover at once) had let its claim go: the takeover is no overlap. A
// holder that sent nothing still holds its lease.
func TestUnconfirmedReleaseLetsTheClaimGo(t *testing.T) {
	overlap := func(letGo bool) bool {
		b := newBuilder().grant("a", "ta", runA, 1, 1)
		b.event(Start, "a", "ta", runA, nil)
		b.at(100*time.Millisecond).event(Return, "a", "ta", runA, func(e *Event) { e.Status = claim.Failed })
		if letGo {
			b.event(LetGo, "a", "ta", runA, func(e *Event) { e.Status = claim.Interrupted; e.Sent = b.now })
		}
		b.at(400*time.Millisecond).grant("b", "tb", runA, 2, 2)
		b.finish("b", "tb", runA, claim.Succeeded)
		return has(Check(b.evs, Spec{}), GrantOverlap)
	}
	if overlap(true) {
		t.Error("a takeover after an unconfirmed release was judged an overlap")
	}
	if !overlap(false) {
		t.Error("a takeover inside the lease of a holder that released nothing was not judged")
	}
}
