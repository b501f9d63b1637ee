package history

import (
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// retried is attempt 1 of runA on a, failing and cutting its lease to
// cut, then attempt 2 granted to b at start2, starting at once.
func retried(cut, start2, return1 time.Duration) []Event {
	b := newBuilder().grant("a", "t1", runA, 1, 1)
	b.event(Start, "a", "t1", runA, nil)
	b.at(cut).event(Renew, "a", "t1", runA, func(e *Event) { e.Sent = b.now; e.Until = b.now.Add(200 * time.Millisecond) })
	b.at(start2).grant("b", "t2", runA, 2, 2)
	b.event(Start, "b", "t2", runA, nil)
	b.at(return1).event(Return, "a", "t1", runA, func(e *Event) { e.Status = claim.Failed })
	b.event(End, "a", "t1", runA, func(e *Event) { e.Status = claim.Retrying })
	b.at(start2+100*time.Millisecond).event(Return, "b", "t2", runA, func(e *Event) { e.Status = claim.Succeeded })
	b.event(Release, "b", "t2", runA, func(e *Event) { e.Status = claim.Succeeded; e.Sent = b.now })
	b.event(End, "b", "t2", runA, func(e *Event) { e.Status = claim.Succeeded })
	return b.evs
}

// A retry granted once the failed attempt's cut lease ended is no
// overlap, though the attempt's earlier renewals reached further; a
// retry started before the failed handler returned is one.
func TestRetryOverlap(t *testing.T) {
	// Returned at 100ms, cut at 110ms to 310ms, retried at 400ms.
	if vs := Check(retried(110*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond), Spec{}); len(vs) != 0 {
		t.Errorf("a clean retry was judged: %v", vs)
	}
	// The return is logged only at 500ms, after attempt 2 started.
	vs := Check(retried(110*time.Millisecond, 400*time.Millisecond, 500*time.Millisecond), Spec{})
	if !has(vs, RetryOverlap) {
		t.Errorf("attempt 2 started before attempt 1 returned, not judged retry-overlap: %v", vs)
	}
}

// A retry that starts before its job's backoff has passed since the
// attempt it retries returned is judged retry-early, unless the clocks
// involved may account for it.
func TestRetryEarly(t *testing.T) {
	// Returned at 100ms, retried at 400ms: 300ms later.
	evs := retried(110*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond)
	if vs := Check(evs, Spec{Backoff: map[string]time.Duration{runA.Job: 250 * time.Millisecond}}); len(vs) != 0 {
		t.Errorf("a retry 300ms after a 250ms backoff was judged: %v", vs)
	}
	if vs := Check(evs, Spec{Backoff: map[string]time.Duration{runA.Job: time.Second}}); !has(vs, RetryEarly) {
		t.Errorf("a retry 300ms after its attempt returned, with a 1s backoff, not judged retry-early: %v", vs)
	}
	if vs := Check(evs, Spec{Backoff: map[string]time.Duration{runA.Job: time.Second}, Slack: 800 * time.Millisecond}); len(vs) != 0 {
		t.Errorf("a retry 300ms after, with a 1s backoff less 800ms of skew, was judged: %v", vs)
	}
	unrecorded := func(string, int) bool { return false }
	if vs := Check(evs, Spec{Backoff: map[string]time.Duration{runA.Job: time.Second}, Recorded: unrecorded}); len(vs) != 0 {
		t.Errorf("a retry of an attempt whose retry time never reached the register was judged: %v", vs)
	}
	clockOff := func(replica string, from, to time.Time) bool { return replica != "b" }
	if vs := Check(evs, Spec{Backoff: map[string]time.Duration{runA.Job: time.Second}, ClockOK: clockOff}); len(vs) != 0 {
		t.Errorf("a retry early by a clock out of bounds was judged: %v", vs)
	}
}

func has(vs []Violation, inv string) bool {
	for _, v := range vs {
		if v.Invariant == inv {
			return true
		}
	}
	return false
}

// A retry whose lease cut got no answer (no renewal logged) may still have
// cut the lease on the backend: the next attempt granted before the old
// lease's end is no overlap, as the attempt had ended retrying first.
func TestRetryAfterAnUnansweredCutIsNoGrantOverlap(t *testing.T) {
	b := newBuilder().grant("a", "t1", runA, 1, 1)
	b.event(Start, "a", "t1", runA, nil)
	b.at(100*time.Millisecond).event(Return, "a", "t1", runA, func(e *Event) { e.Status = claim.Failed })
	b.event(End, "a", "t1", runA, func(e *Event) { e.Status = claim.Retrying })
	b.at(400*time.Millisecond).grant("b", "t2", runA, 2, 2) // within the grant's 1s lease
	b.finish("b", "t2", runA, claim.Succeeded)
	if vs := Check(b.evs, Spec{}); len(vs) != 0 {
		t.Errorf("a retry after the attempt ended retrying was judged: %v", vs)
	}
	// Without the retrying end, the same grant is an overlap.
	b = newBuilder().grant("a", "t1", runA, 1, 1)
	b.event(Start, "a", "t1", runA, nil)
	b.at(400*time.Millisecond).grant("b", "t2", runA, 2, 2)
	if !has(Check(b.evs, Spec{}), GrantOverlap) {
		t.Error("a grant within a live holder's lease was not judged grant-overlap")
	}
}

// A run granted again from attempt 1 after the backend lost its record
// (a Redis server gone back in time, every replica that knew of the run
// restarted): the new attempt 1, failing and retried, is not the attempt
// the first lineage's attempt 2 retried, though it has a lower number.
// The explorer's redis seed 33000005 paired them and reported
// retry-overlap for a rerun `redone` already judges (and excused).
func TestARetryIsNotPairedWithAnAttemptGrantedAfterIt(t *testing.T) {
	b := newBuilder().grant("a", "t1", runA, 1, 1)
	b.event(Start, "a", "t1", runA, nil)
	b.at(100*time.Millisecond).event(Return, "a", "t1", runA, func(e *Event) { e.Status = claim.Failed })
	b.event(End, "a", "t1", runA, func(e *Event) { e.Status = claim.Retrying })
	b.at(1200*time.Millisecond).grant("b", "t2", runA, 2, 2)
	b.finish("b", "t2", runA, claim.Succeeded)
	// The record lost: attempt 1 again, 4s later, failing.
	b.at(5*time.Second).grant("c", "t3", runA, 3, 1)
	b.event(Start, "c", "t3", runA, nil)
	b.at(5100*time.Millisecond).event(Return, "c", "t3", runA, func(e *Event) { e.Status = claim.Failed })
	b.event(End, "c", "t3", runA, func(e *Event) { e.Status = claim.Retrying })
	if vs := Check(b.evs, Spec{}); has(vs, RetryOverlap) || has(vs, RetryEarly) {
		t.Errorf("attempt 2 judged against an attempt 1 granted after it: %v", vs)
	}
	// Its own retry, started before it returned, still is an overlap.
	b.at(5050*time.Millisecond).grant("a", "t4", runA, 4, 2)
	b.event(Start, "a", "t4", runA, nil)
	if vs := Check(b.evs, Spec{}); !has(vs, RetryOverlap) {
		t.Errorf("a retry started before the attempt it retries returned, not judged retry-overlap: %v", vs)
	}
}
