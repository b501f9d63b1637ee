package redisnode_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// TestControlVersionsAreComparedToTheNanosecond: versions are unix
// nanoseconds, beyond what a Lua number holds exactly; two writes one
// nanosecond apart must still be ordered. Expiry survives to the
// nanosecond, and DropPrefix deletes the namespace's controls.
func TestControlVersionsAreComparedToTheNanosecond(t *testing.T) {
	client, p := isolated(t)
	node := redisnode.New(client, redisnode.Options{Prefix: p}, 0, 1)
	put := func(c claim.Control) claim.Control {
		t.Helper()
		got, err := node.PutControl(ctxT(t), c)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	v := time.Now().UnixNano() // > 2^53
	expires := time.Now().Add(time.Hour).Add(123 * time.Nanosecond)
	value := []byte("a\x00b\xff")
	old := claim.Control{Key: "pause/j", Value: value, Version: v, Expires: expires}
	put(old)
	newer := claim.Control{Key: "pause/j", Value: []byte("newer"), Version: v + 1}
	if got := put(newer); got.Version != v+1 || string(got.Value) != "newer" {
		t.Fatalf("a write 1ns later: got v%d %q, want v%d", got.Version, got.Value, v+1)
	}
	if got := put(old); got.Version != v+1 {
		t.Fatalf("a write 1ns earlier replaced the entry: got v%d", got.Version)
	}
	put(claim.Control{Key: "request/r", Value: value, Version: v, First: true, Expires: expires})
	list, err := node.ListControls(ctxT(t), "request/")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || !list[0].First || list[0].Version != v || !bytes.Equal(list[0].Value, value) || !list[0].Expires.Equal(expires) {
		t.Fatalf("listed %+v, want v%d first, value %q, expiring %v", list, v, value, expires)
	}
	if n, err := client.Exists(ctxT(t), p+"controls").Result(); err != nil || n != 1 {
		t.Fatalf("controls hash %scontrols: exists %d, %v", p, n, err)
	}
	if err := redisnode.DropPrefix(ctxT(t), client, p); err != nil {
		t.Fatal(err)
	}
	if list, err := node.ListControls(ctxT(t), ""); err != nil || len(list) != 0 {
		t.Fatalf("after DropPrefix: %+v, %v", list, err)
	}
}
