package claim_test

import (
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// TestUnseenGivesATokenOnceWhileItsGrantMayLive: Take returns the token
// noted for a run once, and only before its grant's lease would have run
// out; a later note of the run replaces an earlier one.
func TestUnseenGivesATokenOnceWhileItsGrantMayLive(t *testing.T) {
	var u claim.Unseen
	now := time.Now()
	u.Note("a", "t1", now.Add(time.Hour))
	u.Note("a", "t2", now.Add(time.Hour))
	u.Note("b", "t3", now.Add(-time.Millisecond))
	if tok, ok := u.Take("a"); !ok || tok != "t2" {
		t.Fatalf("Take(a) = %q, %v; want the latest note, t2", tok, ok)
	}
	if tok, ok := u.Take("a"); ok {
		t.Fatalf("Take(a) again = %q: want it forgotten", tok)
	}
	if tok, ok := u.Take("b"); ok {
		t.Fatalf("Take(b) = %q past its lease: want nothing", tok)
	}
	if _, ok := u.Take("c"); ok {
		t.Fatal("Take of a run never noted: want nothing")
	}
}
