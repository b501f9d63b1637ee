package redisnode

import (
	"testing"
	"time"
)

// TestServerClocksKeepTheQuickestCallsOffsetPerServer: the offset a
// server's clock reads ahead by is the least over its calls, so a call
// that waited in the server does not raise it; each incarnation has its
// own; one never heard from has none.
func TestServerClocksKeepTheQuickestCallsOffsetPerServer(t *testing.T) {
	var c serverClocks
	if _, ok := c.latest("a", 100, time.Second); ok {
		t.Fatal("an offset for a server never heard from")
	}
	sent := localMS()
	c.observe("a", sent, sent+5_000) // 5s ahead, a quick call
	c.observe("a", sent, sent+9_000) // a call that waited 4s
	c.observe("b", sent, sent-3_000) // another server, 3s behind
	if by, ok := c.latest("a", 1_000, 250*time.Millisecond); !ok || by != 1_000+5_000+250 {
		t.Fatalf("a: %d, %v; want send + the least offset + the wait allowed", by, ok)
	}
	if by, ok := c.latest("b", 1_000, 0); !ok || by != 1_000-3_000 {
		t.Fatalf("b: %d, %v; want its own offset", by, ok)
	}
	// A window later, the least of the window before still counts.
	c.by["a"].since -= clockWindow.Milliseconds() + 1
	c.observe("a", sent, sent+7_000)
	if by, _ := c.latest("a", 0, 0); by != 5_000 {
		t.Fatalf("a window on: %d, want the previous window's least, 5000", by)
	}
	// Two windows on, it has left.
	c.by["a"].since -= clockWindow.Milliseconds() + 1
	c.observe("a", sent, sent+7_000)
	if by, _ := c.latest("a", 0, 0); by != 7_000 {
		t.Fatalf("two windows on: %d, want 7000", by)
	}
}
