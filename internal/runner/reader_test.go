package runner_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// gatedHistories is a memory claimer whose Histories calls are recorded;
// the first waits for gate.
type gatedHistories struct {
	*memory.Claimer
	mu    sync.Mutex
	calls [][]claim.HistoryQuery
	gate  chan struct{}
	first chan struct{} // closed when the first call arrived
}

func (g *gatedHistories) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	g.mu.Lock()
	g.calls = append(g.calls, slices.Clone(qs))
	n := len(g.calls)
	g.mu.Unlock()
	if n == 1 {
		close(g.first)
		<-g.gate
	}
	return g.Claimer.Histories(ctx, qs)
}

// TestHistoryReadsAreAnsweredByABatchSentAfterThem: the overlap probe's
// reads are coalesced, but a read is never answered by a batch that was
// already in flight when it was asked for: that batch may predate a grant
// the read must see (the probe's ordering argument, see owners). Reads
// asked for together share one query, and a read whose caller left is
// not sent.
func TestHistoryReadsAreAnsweredByABatchSentAfterThem(t *testing.T) {
	store := memory.NewStore(nil)
	g := &gatedHistories{Claimer: memory.New(store, "a"), gate: make(chan struct{}), first: make(chan struct{})}
	r, err := runner.New(runner.Options{Claimer: g, ClaimerName: "memory", Instance: "a"}, []runner.Job{{
		Name: "job.read", Schedule: mustSchedule(t, "@every 1m"), Handler: func(context.Context, job.Run) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	read, queued, wait := runner.HistoryReader(r)
	type answer struct {
		recs []claim.Record
		err  error
	}
	ask := func(ctx context.Context, job string) chan answer {
		c := make(chan answer, 1)
		go func() { recs, err := read(ctx, job, 16); c <- answer{recs, err} }()
		return c
	}

	first := ask(t.Context(), "job.read") // goes out at once and is held in flight
	<-g.first
	// A grant lands while the first batch is in flight: every read asked
	// for from now on must see it.
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	if _, err := claim.ClaimOne(t.Context(), memory.New(store, "b"), claim.Run{Job: "job.read", At: at}, time.Minute); err != nil {
		t.Fatal(err)
	}
	leftCtx, leave := context.WithCancel(t.Context())
	second, third, left := ask(t.Context(), "job.read"), ask(t.Context(), "job.read"), ask(leftCtx, "job.left")
	for deadline := time.Now().Add(10 * time.Second); queued() < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d reads queued behind the batch in flight, want 3", queued())
		}
	}
	leave()
	if a := <-left; a.err == nil {
		t.Fatalf("a read whose caller left answered %v", a.recs)
	}
	close(g.gate)
	if a := <-first; a.err != nil {
		t.Fatal(a.err)
	}
	for i, c := range []chan answer{second, third} {
		a := <-c
		if a.err != nil || len(a.recs) != 1 || !a.recs[0].At.Equal(at) {
			t.Fatalf("read %d, asked for after the grant: %+v, %v; want the grant", i+2, a.recs, a.err)
		}
	}
	wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	want := [][]claim.HistoryQuery{{{Job: "job.read", Limit: 16}}, {{Job: "job.read", Limit: 16}}}
	if !slices.EqualFunc(g.calls, want, slices.Equal) {
		t.Fatalf("Histories calls %v, want %v: the first read alone, then one query for the two waiting (the third left)", g.calls, want)
	}
}

// The reader answers the probes of one job queued together with one page,
// shared: each probe adds the runs it executes here to its own copy, never
// to the page another probe reads (found by the race detector in CI's
// explorer: two probes of a buffer-one job appended to one page at once,
// and one could count the other's run).
func TestAProbeAddsItsHeldRunsToItsOwnCopyOfASharedPage(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	rec := func(s int) claim.Record {
		run := claim.Run{Job: "queue", At: at.Add(time.Duration(s) * time.Second)}
		return claim.Record{RunID: run.ID(), Job: run.Job, At: run.At, Status: claim.Running}
	}
	page := make([]claim.Record, 2, 8) // room to append in place
	page[0], page[1] = rec(10), rec(8)
	self := func(s int) *claim.Claim {
		return &claim.Claim{Run: claim.Run{Job: "queue", At: at.Add(time.Duration(s) * time.Second)}}
	}
	a := runner.WithHeldHere(page, []claim.Record{rec(2)}, self(12))
	b := runner.WithHeldHere(page, []claim.Record{rec(4)}, self(14))
	if len(a) != 3 || a[2].RunID != rec(2).RunID || len(b) != 3 || b[2].RunID != rec(4).RunID {
		t.Fatalf("first probe's page %v, second's %v: each must list its own held run", ids(a), ids(b))
	}
	if len(page) != 2 || page[0].RunID != rec(10).RunID {
		t.Fatalf("the shared page changed: %v", ids(page))
	}
}

func ids(recs []claim.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.RunID
	}
	return out
}
