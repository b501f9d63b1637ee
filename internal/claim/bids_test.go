package claim_test

import (
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// TestBidsGiveTheNextTryOnlyOfAnOpenLiveBid: a run's claim token is a new
// bid's first try, unless a claim of it left a bid open that may still hold
// a grant: then it is that bid's next try, once.
func TestBidsGiveTheNextTryOnlyOfAnOpenLiveBid(t *testing.T) {
	var b claim.Bids
	run := claim.Run{Job: "job.bids", At: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)}
	first := b.Token(run)
	name, ok := strings.CutSuffix(first, "-1")
	if !ok || len(name) != 32 {
		t.Fatalf("first token %q: want a new bid's first try, <32 hex>-1", first)
	}
	if again := b.Token(run); again == first {
		t.Fatalf("a second claim of a run whose bid was not opened reused its token %q", again)
	}
	b.Open(run, first, time.Now().Add(time.Minute))
	if next := b.Token(run); next != name+"-2" {
		t.Fatalf("after Open: %q, want the bid's next try %q", next, name+"-2")
	}
	if fresh := b.Token(run); strings.HasPrefix(fresh, name) {
		t.Fatalf("the open bid was used once already, yet %q continues it", fresh)
	}
	b.Open(run, name+"-7", time.Now().Add(-time.Millisecond))
	if stale := b.Token(run); strings.HasPrefix(stale, name) {
		t.Fatalf("a bid whose grants have expired continues as %q", stale)
	}
	other := claim.Run{Job: "job.bids", At: run.At.Add(time.Minute)}
	b.Open(other, "no-try-number", time.Now().Add(time.Minute))
	b.Open(run, "abc", time.Now().Add(time.Minute))
	if tok := b.Token(run); !strings.HasSuffix(tok, "-1") || strings.HasPrefix(tok, "abc") {
		t.Fatalf("a token without a try opened a bid: %q", tok)
	}
	if tok := b.Token(other); strings.HasPrefix(tok, "no-try") {
		t.Fatalf("a token whose try is not a number opened a bid: %q", tok)
	}
}
