package claimtest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
)

// controlCases hold every backend's claim.Controls to its contract: the
// register pauses and run requests live in, read by every replica.
func controlCases(t *testing.T, newClaimers Factory, opts Options) {
	put := func(t *testing.T, b *claimers.Backend, c claim.Control) claim.Control {
		t.Helper()
		got, err := b.Controls.Put(ctxT(t), c)
		if err != nil {
			t.Fatalf("put %s v%d: %v", c.Key, c.Version, err)
		}
		return got
	}
	list := func(t *testing.T, b *claimers.Backend, prefix string) []claim.Control {
		t.Helper()
		got, err := b.Controls.List(ctxT(t), prefix)
		if err != nil {
			t.Fatalf("list %q: %v", prefix, err)
		}
		return got
	}
	same := func(t *testing.T, what string, got, want claim.Control) {
		t.Helper()
		if got.Key != want.Key || got.Version != want.Version || !bytes.Equal(got.Value, want.Value) || got.First != want.First {
			t.Fatalf("%s: got %s v%d %q first=%t, want %s v%d %q first=%t", what,
				got.Key, got.Version, got.Value, got.First, want.Key, want.Version, want.Value, want.First)
		}
	}

	t.Run("ControlsLatestVersionWinsAcrossReplicas", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("a"), open("b")
		v2 := claim.Control{Key: "pause/j", Value: []byte(`{"paused":true}`), Version: 2}
		same(t, "first put", put(t, a, v2), v2)
		same(t, "older put", put(t, b, claim.Control{Key: "pause/j", Value: []byte("old"), Version: 1}), v2)
		same(t, "tie", put(t, b, claim.Control{Key: "pause/j", Value: []byte("tie"), Version: 2}), v2)
		v3 := claim.Control{Key: "pause/j", Value: []byte(`{"paused":false}`), Version: 3}
		same(t, "newer put", put(t, b, v3), v3)
		got := list(t, a, "pause/")
		if len(got) != 1 {
			t.Fatalf("list: %d entries, want 1: %+v", len(got), got)
		}
		same(t, "list from the other replica", got[0], v3)
	})

	t.Run("ControlsFirstVersionWinsForIdempotencyKeys", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("a"), open("b")
		first := claim.Control{Key: "request/r1", Value: []byte("first"), Version: 100, First: true}
		same(t, "first request", put(t, a, first), first)
		same(t, "retry from another replica", put(t, b, claim.Control{Key: "request/r1", Value: []byte("retry"), Version: 200, First: true}), first)
		same(t, "retry again", put(t, a, first), first)
		got := list(t, b, "request/")
		if len(got) != 1 {
			t.Fatalf("list: %d entries, want 1", len(got))
		}
		same(t, "listed", got[0], first)
	})

	t.Run("ControlsConcurrentFirstPutsAgreeOnOneEntry", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		clients := []*claimers.Backend{open("a"), open("b"), open("c"), open("d")}
		const n = 32
		var wg sync.WaitGroup
		errs := make([]error, n)
		got := make([]claim.Control, n)
		for i := range n {
			wg.Go(func() {
				c := claim.Control{Key: "request/race", Value: fmt.Appendf(nil, "v%d", i+1), Version: int64(i + 1), First: true}
				got[i], errs[i] = clients[i%len(clients)].Controls.Put(ctxT(t), c)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		// A retry after the race learns the one entry that stayed, and
		// every replica lists it.
		after := put(t, clients[0], claim.Control{Key: "request/race", Value: []byte("late"), Version: 1000, First: true})
		if string(after.Value) == "late" {
			t.Fatal("a first put after the race replaced the entry")
		}
		for _, c := range clients {
			l := list(t, c, "request/race")
			if len(l) != 1 {
				t.Fatalf("after the race: %d entries, want 1", len(l))
			}
			same(t, "listed after the race", l[0], after)
		}
		for i, g := range got {
			if g.Version < 1 || g.Version > n || string(g.Value) != fmt.Sprintf("v%d", g.Version) {
				t.Fatalf("put %d returned %+v, not one of the racing entries", i+1, g)
			}
		}
	})

	t.Run("ControlsFirstEntryStaysWhateverItsVersion", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("a"), open("b")
		first := claim.Control{Key: "request/skewed", Value: []byte("first"), Version: 500, First: true}
		same(t, "first", put(t, a, first), first)
		// A retry from a host whose clock is behind carries a lower
		// version; it must still learn of the first request.
		same(t, "retry from behind", put(t, b, claim.Control{Key: "request/skewed", Value: []byte("retry"), Version: 400, First: true}), first)
	})

	t.Run("ControlsListFiltersByPrefixSortsAndKeepsBytes", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a := open("a")
		odd := []byte("{\"note\":\"naïve \\\"quoted\\\"\"}\x00\xff\n")
		for _, k := range []string{"pause/b", "request/x", "pause/a", "pause/*", "pauses"} {
			put(t, a, claim.Control{Key: k, Value: odd, Version: 7})
		}
		got := list(t, a, "pause/")
		var keys []string
		for _, c := range got {
			keys = append(keys, c.Key)
			if !bytes.Equal(c.Value, odd) {
				t.Fatalf("%s: value %q, want %q", c.Key, c.Value, odd)
			}
		}
		if want := []string{"pause/*", "pause/a", "pause/b"}; !slices.Equal(keys, want) {
			t.Fatalf("keys %v, want %v", keys, want)
		}
		if all := list(t, a, ""); len(all) != 5 {
			t.Fatalf("list all: %d entries, want 5", len(all))
		}
		if other := list(t, newClaimers(t)("z"), ""); len(other) != 0 {
			t.Fatalf("another namespace sees %d entries", len(other))
		}
	})

	t.Run("ControlsListPrefixesReadsEachKindOnceAsListsDo", func(t *testing.T) {
		t.Parallel()
		a := newClaimers(t)("a")
		for _, k := range []string{"pause/b", "request/x", "pause/a", "member/m", "members", "schedule/j"} {
			put(t, a, claim.Control{Key: k, Value: []byte(k), Version: 3})
		}
		put(t, a, claim.Control{Key: "member/gone", Value: []byte("gone"), Version: 3, Expires: time.Now().Add(-time.Second)})
		// "pause/" and "pause/a" overlap: pause/a is listed once.
		prefixes := []string{"pause/", "member/", "pause/a", "revoke/"}
		want := []string{"member/m", "pause/a", "pause/b"}
		keys := func(cs []claim.Control) []string {
			var ks []string
			for _, c := range cs {
				if !bytes.Equal(c.Value, []byte(c.Key)) {
					t.Fatalf("%s: value %q", c.Key, c.Value)
				}
				ks = append(ks, c.Key)
			}
			return ks
		}
		got, err := claim.ListPrefixes(ctxT(t), a.Controls, prefixes...)
		if err != nil || !slices.Equal(keys(got), want) {
			t.Fatalf("ListPrefixes(%q) = %v, %v; want %v", prefixes, keys(got), err, want)
		}
		// The same answer through one List per prefix, whether or not the
		// backend reads them in one pass.
		perList, err := claim.ListPrefixes(ctxT(t), struct{ claim.Controls }{a.Controls}, prefixes...)
		if err != nil || !slices.Equal(keys(perList), want) {
			t.Fatalf("one List per prefix = %v, %v; want %v", keys(perList), err, want)
		}
		if none, err := claim.ListPrefixes(ctxT(t), a.Controls); err != nil || len(none) != 0 {
			t.Fatalf("no prefixes: %v, %v; want nothing", keys(none), err)
		}
	})

	t.Run("ControlsPutBatchAnswersEachEntryAsItsPutWould", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("a"), open("b")
		stays := claim.Control{Key: "request/r", Value: []byte("first"), Version: 5, First: true}
		newer := claim.Control{Key: "schedule/b", Value: []byte("newer"), Version: 9}
		put(t, a, stays)
		put(t, a, newer)
		batch := []claim.Control{
			{Key: "schedule/c", Value: []byte("c"), Version: 3},                 // new key: stored
			{Key: "schedule/b", Value: []byte("older"), Version: 4},             // loses to v9: v9 answered
			{Key: "request/r", Value: []byte("retry"), Version: 1, First: true}, // First: the stored one stays
			{Key: "", Value: []byte("bad"), Version: 1},                         // invalid: its own error only
			{Key: "schedule/a", Value: []byte("a"), Version: 2},                 // out of key order on purpose
		}
		want := []claim.Control{batch[0], newer, stays, {}, batch[4]}
		// Through the backend's batch, and through one Put per entry (the
		// fallback of a register without one): the same answers.
		for _, via := range []struct {
			name string
			reg  claim.Controls
		}{{"batch", b.Controls}, {"one put each", struct{ claim.Controls }{b.Controls}}} {
			got, errs := claim.PutBatch(ctxT(t), via.reg, batch)
			if len(got) != len(batch) || len(errs) != len(batch) {
				t.Fatalf("%s: %d answers and %d errors for %d entries", via.name, len(got), len(errs), len(batch))
			}
			for i := range batch {
				if i == 3 {
					if !errors.Is(errs[i], claim.ErrInvalid) {
						t.Fatalf("%s: empty key: %v, want ErrInvalid", via.name, errs[i])
					}
					continue
				}
				if errs[i] != nil {
					t.Fatalf("%s: %s: %v", via.name, batch[i].Key, errs[i])
				}
				same(t, via.name+": "+batch[i].Key, got[i], want[i])
			}
		}
		var keys []string
		for _, c := range list(t, a, "schedule/") {
			keys = append(keys, string(c.Value))
		}
		if !slices.Equal(keys, []string{"a", "newer", "c"}) {
			t.Fatalf("schedule entries after the batch: %q, want a, newer, c", keys)
		}
	})

	t.Run("ControlsPutBatchOfManyEntriesDecidesEachOnItsOwn", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("a"), open("b")
		// More entries than a backend may send in one request, and one
		// key twice: the newer entry wins whichever lands first (a
		// register without a batch of its own puts them side by side).
		var batch []claim.Control
		for i := range 250 {
			batch = append(batch, claim.Control{Key: fmt.Sprintf("many/%03d", i), Value: []byte("v1"), Version: 1})
		}
		batch = append(batch, claim.Control{Key: "many/007", Value: []byte("v2"), Version: 2})
		got, errs := claim.PutBatch(ctxT(t), a.Controls, batch)
		for i := range batch {
			if errs[i] != nil {
				t.Fatalf("%s v%d: %v", batch[i].Key, batch[i].Version, errs[i])
			}
			if i == 7 && got[i].Version == 2 {
				continue // v2 landed first: v1 lost to it
			}
			same(t, batch[i].Key, got[i], batch[i])
		}
		listed := list(t, b, "many/")
		if len(listed) != 250 {
			t.Fatalf("listed %d entries, want 250", len(listed))
		}
		same(t, "the key put twice", listed[7], batch[250])
	})

	t.Run("ControlsExpireAndAnExpiredEntryLosesToAnyPut", func(t *testing.T) {
		t.Parallel()
		open := newClaimers(t)
		a, b := open("a"), open("b")
		// Two seconds at least: two puts and a list must land before it
		// expires on a loaded machine (300ms did not, once in CI).
		short := claim.Control{Key: "request/short", Value: []byte("old"), Version: 1, First: true,
			Expires: time.Now().Add(max(opts.Lease, 2*time.Second))}
		keep := claim.Control{Key: "request/keep", Value: []byte("keep"), Version: 1, First: true,
			Expires: time.Now().Add(longLease)}
		put(t, a, short)
		put(t, a, keep)
		if got := list(t, b, "request/"); len(got) != 2 {
			t.Fatalf("before expiry: %d entries, want 2", len(got))
		}
		deadline := time.Now().Add(waitFor)
		for len(list(t, b, "request/short")) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("request/short still listed %v after its expiry", waitFor)
			}
			time.Sleep(20 * time.Millisecond) // backend-side expiry; no event to wait on
		}
		later := claim.Control{Key: "request/short", Value: []byte("new"), Version: 5, First: true}
		same(t, "put over the expired entry", put(t, b, later), later)
		if got := list(t, a, "request/"); len(got) != 2 {
			t.Fatalf("after expiry and a new put: %d entries, want 2", len(got))
		}
	})

	t.Run("ControlsRejectBadInput", func(t *testing.T) {
		t.Parallel()
		a := newClaimers(t)("a")
		for _, c := range []claim.Control{{Key: "", Version: 1}, {Key: "k", Version: 0}, {Key: "a\nb", Version: 1}} {
			_, err := a.Controls.Put(ctxT(t), c)
			wantErr(t, err, claim.ErrInvalid, fmt.Sprintf("put %q v%d", c.Key, c.Version))
		}
	})

	t.Run("PruneDropsExpiredControlsAndKeepsTheRest", func(t *testing.T) {
		t.Parallel()
		b := newClaimers(t)("a")
		if b.Pruner == nil {
			if opts.Prunes {
				t.Fatal("the opener offers no Pruner for a backend that keeps finished runs")
			}
			t.Skip("the backend expires entries itself; the expiry case covers it")
		}
		for _, c := range []claim.Control{
			{Key: "request/gone", Version: 1, First: true, Expires: time.Now().Add(time.Millisecond)},
			{Key: "request/kept", Version: 1, First: true, Expires: time.Now().Add(time.Hour)},
			{Key: "pause/j", Version: 1}, // a nil value is stored, as empty
		} {
			got := put(t, b, c)
			// Stored to the backend's precision (SQLite: milliseconds,
			// rounded up so that nothing expires early).
			if !c.Expires.IsZero() && (got.Expires.Before(c.Expires.Add(-time.Microsecond)) || got.Expires.After(c.Expires.Add(time.Millisecond))) {
				t.Fatalf("put %s: expires %v, want %v", c.Key, got.Expires, c.Expires)
			}
		}
		time.Sleep(10 * time.Millisecond) // request/gone expires
		if n, err := b.Pruner.Prune(ctxT(t), time.Hour); err != nil || n != 0 {
			t.Fatalf("prune = %d, %v; want 0 runs (controls are not counted)", n, err)
		}
		if b.DB != nil {
			var rows int
			if err := b.DB.QueryRowContext(ctxT(t), "SELECT count(*) FROM scheduler_controls").Scan(&rows); err != nil || rows != 2 {
				t.Fatalf("rows after prune = %d, %v; want 2: the expired entry deleted", rows, err)
			}
		}
		if l := list(t, b, ""); len(l) != 2 || l[0].Key != "pause/j" || l[1].Key != "request/kept" {
			t.Fatalf("list after prune = %+v", l)
		}
	})
}
