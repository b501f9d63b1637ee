package sqlite_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// Prune also deletes expired controls, without counting them, and keeps
// the unexpired ones. A nil value is stored (as empty).
func TestPruneDeletesExpiredControls(t *testing.T) {
	ctx := t.Context()
	b := backends.Open(t, "sqlite")("a")
	for _, c := range []claim.Control{
		{Key: "request/gone", Version: 1, First: true, Expires: time.Now().Add(time.Millisecond)},
		{Key: "request/kept", Version: 1, First: true, Expires: time.Now().Add(time.Hour)},
		{Key: "pause/j", Version: 1},
	} {
		got, err := b.Controls.Put(ctx, c)
		if err != nil || !bytes.Equal(got.Value, c.Value) {
			t.Fatalf("put %s = %+v, %v", c.Key, got, err)
		}
		if !c.Expires.IsZero() && (got.Expires.Before(c.Expires) || got.Expires.After(c.Expires.Add(time.Millisecond))) {
			t.Fatalf("put %s: expires %v, want %v rounded up to the millisecond", c.Key, got.Expires, c.Expires)
		}
	}
	time.Sleep(10 * time.Millisecond)
	if n, err := b.Pruner.Prune(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("prune = %d, %v; want 0 runs", n, err)
	}
	var rows int
	if err := b.DB.QueryRowContext(ctx, "SELECT count(*) FROM scheduler_controls").Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("rows after prune = %d, %v; want 2", rows, err)
	}
	if l, err := b.Controls.List(ctx, ""); err != nil || len(l) != 2 || l[0].Key != "pause/j" || l[1].Key != "request/kept" {
		t.Fatalf("list after prune = %+v, %v", l, err)
	}
}
