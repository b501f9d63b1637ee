package claim_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// sends records each batch a Coalescer sent, and holds each send until
// the test lets it go.
type sends struct {
	mu      sync.Mutex
	batches [][]int
	gate    chan struct{}
	ctxs    []context.Context
}

func (s *sends) send(ctx context.Context, in []int) []int {
	s.mu.Lock()
	s.batches = append(s.batches, slices.Clone(in))
	s.ctxs = append(s.ctxs, ctx)
	s.mu.Unlock()
	<-s.gate
	out := make([]int, len(in))
	for i, v := range in {
		out[i] = v * 10
	}
	return out
}

// busy returns a Coalescer with one call, of input 1, in flight (held
// until the test lets s go), and the group the call runs in.
func busy(t *testing.T) (*claim.Coalescer[int, int], *sends, *sync.WaitGroup) {
	co := &claim.Coalescer[int, int]{}
	s := &sends{gate: make(chan struct{})}
	wg := &sync.WaitGroup{}
	wg.Go(func() { co.Do(t.Context(), []int{1}, s.send, nil) })
	synctest.Wait()
	return co, s, wg
}

func TestACoalescerSendsALoneCallAtOnceAndMergesTheCallsThatWaitBehindIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var co claim.Coalescer[int, int]
		s := &sends{gate: make(chan struct{})}
		results := make([][]int, 4)
		var wg sync.WaitGroup
		wg.Go(func() { results[0] = co.Do(t.Context(), []int{1}, s.send, nil) })
		synctest.Wait() // the first call is in flight, alone
		if len(s.batches) != 1 || !slices.Equal(s.batches[0], []int{1}) {
			t.Fatalf("batches %v, want the first call sent alone at once", s.batches)
		}
		wg.Go(func() { results[1] = co.Do(t.Context(), []int{2, 3}, s.send, nil) })
		wg.Go(func() { results[2] = co.Do(t.Context(), []int{4}, s.send, nil) })
		synctest.Wait()
		if len(s.batches) != 1 {
			t.Fatalf("batches %v: a call went while another was in flight", s.batches)
		}
		s.gate <- struct{}{} // the first batch returns; the two waiting go as one
		synctest.Wait()
		if len(s.batches) != 2 || len(s.batches[1]) != 3 {
			t.Fatalf("batches %v, want the waiting calls' inputs merged into the second", s.batches)
		}
		wg.Go(func() { results[3] = co.Do(t.Context(), []int{5}, s.send, nil) })
		synctest.Wait()
		s.gate <- struct{}{}
		synctest.Wait()
		s.gate <- struct{}{}
		wg.Wait()
		want := [][]int{{10}, {20, 30}, {40}, {50}}
		for i := range want {
			if !slices.Equal(results[i], want[i]) {
				t.Errorf("call %d got %v, want %v", i, results[i], want[i])
			}
		}
		if len(s.batches) != 3 || !slices.Equal(s.batches[2], []int{5}) {
			t.Errorf("batches %v, want the last call sent alone", s.batches)
		}
	})
}

// A caller whose ctx ends while its batch is in flight returns at once,
// whatever the deadlines of the callers merged with it: its share goes to
// abandon once the batch returns. The batch itself is cancelled only once
// all its callers left.
func TestACallerLeavesItsBatchInFlightAtOnceAndItsShareIsAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var co claim.Coalescer[int, int]
		s := &sends{gate: make(chan struct{})}
		var wg sync.WaitGroup
		first, cancelFirst := context.WithCancel(t.Context())
		wg.Go(func() { co.Do(first, []int{1}, s.send, nil) })
		synctest.Wait()
		var mu sync.Mutex
		var abandoned [][]int
		abandon := func(out []int) {
			mu.Lock()
			defer mu.Unlock()
			abandoned = append(abandoned, out)
		}
		a, cancelA := context.WithCancel(t.Context())
		b, cancelB := context.WithCancel(t.Context())
		gotA, gotB := make(chan []int, 1), make(chan []int, 1)
		wg.Go(func() { gotA <- co.Do(a, []int{2}, s.send, abandon) })
		wg.Go(func() { gotB <- co.Do(b, []int{3}, s.send, abandon) })
		synctest.Wait()
		cancelFirst()
		s.gate <- struct{}{} // the second batch (a and b) goes
		synctest.Wait()
		batch := s.ctxs[1]
		cancelA()
		synctest.Wait()
		select {
		case got := <-gotA:
			if got != nil {
				t.Fatalf("a caller that left its batch in flight got %v, want nil", got)
			}
		default:
			t.Fatal("a caller that left its batch in flight is still waiting for it")
		}
		if batch.Err() != nil {
			t.Fatal("the batch was cancelled when one of its two callers left")
		}
		cancelB()
		synctest.Wait()
		if batch.Err() == nil {
			t.Fatal("the batch was not cancelled once both its callers left")
		}
		if len(gotB) != 1 || len(abandoned) != 0 {
			t.Fatalf("b returned: %v; abandoned before the batch returned: %v", len(gotB) == 1, abandoned)
		}
		s.gate <- struct{}{}
		wg.Wait()
		synctest.Wait() // the batch's sender hands the shares on as it ends
		mu.Lock()
		defer mu.Unlock()
		slices.SortFunc(abandoned, func(x, y []int) int { return x[0] - y[0] })
		if len(abandoned) != 2 || !slices.Equal(abandoned[0], []int{20}) || !slices.Equal(abandoned[1], []int{30}) {
			t.Errorf("abandoned shares %v, want [20] and [30]", abandoned)
		}
	})
}

// The case an outside review found: a caller with a short deadline merged
// with one that has none returns at its own deadline, not the batch's.
func TestAShortDeadlineMergedWithNoneReturnsAtItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		co, s, wg := busy(t)
		undone := make(chan []int, 1)
		short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		returned := make(chan time.Duration, 1)
		start := time.Now()
		wg.Go(func() { co.Do(t.Context(), []int{2}, s.send, nil) })
		wg.Go(func() {
			co.Do(short, []int{3}, s.send, func(out []int) { undone <- out })
			returned <- time.Since(start)
		})
		synctest.Wait()
		s.gate <- struct{}{} // the first batch returns; the two go together
		synctest.Wait()
		if len(s.batches) != 2 || len(s.batches[1]) != 2 {
			t.Fatalf("batches %v, want the two waiting calls merged", s.batches)
		}
		time.Sleep(time.Second) // the merged batch is held far past the short deadline
		select {
		case took := <-returned:
			if took != 100*time.Millisecond {
				t.Errorf("the short caller returned after %v, want at its deadline (100ms)", took)
			}
		default:
			t.Fatal("the short caller waits for the batch merged with a caller without deadline")
		}
		s.gate <- struct{}{}
		wg.Wait()
		if got := <-undone; !slices.Equal(got, []int{30}) {
			t.Errorf("the short caller's abandoned share is %v, want [30]", got)
		}
	})
}

func TestACallerThatLeftBeforeItsBatchWentIsLeftOutOfIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		co, s, wg := busy(t)
		gone, cancel := context.WithCancel(t.Context())
		var gotGone, gotStaying []int
		wg.Go(func() { gotGone = co.Do(gone, []int{2}, s.send, nil) })
		wg.Go(func() { gotStaying = co.Do(t.Context(), []int{3}, s.send, nil) })
		synctest.Wait()
		cancel()
		s.gate <- struct{}{}
		synctest.Wait()
		s.gate <- struct{}{}
		wg.Wait()
		if gotGone != nil || !slices.Equal(gotStaying, []int{30}) {
			t.Errorf("got %v for the caller that left and %v for the one that stayed, want nil and [30]", gotGone, gotStaying)
		}
		if len(s.batches) != 2 || !slices.Equal(s.batches[1], []int{3}) {
			t.Errorf("batches %v, want the second without the caller that left", s.batches)
		}
	})
}

func TestAQueuedCallerWhoseContextEndsReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		co, s, wg := busy(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		if got := co.Do(ctx, []int{2}, s.send, nil); got != nil {
			t.Errorf("a caller that left while queued got %v, want nil", got)
		}
		if took := time.Since(start); took != time.Second {
			t.Errorf("a queued caller whose deadline passed returned after %v, want at its deadline", took)
		}
		// The one it left behind still goes, and later callers too.
		var later []int
		wg.Go(func() { later = co.Do(t.Context(), []int{3}, s.send, nil) })
		synctest.Wait()
		s.gate <- struct{}{}
		synctest.Wait()
		s.gate <- struct{}{}
		wg.Wait()
		if !slices.Equal(later, []int{30}) || len(s.batches) != 2 || !slices.Equal(s.batches[1], []int{3}) {
			t.Errorf("batches %v, later call got %v: want the caller that left out, [3] sent", s.batches, later)
		}
	})
}

func TestACallerGivenItsTurnToSendThatLeftHandsTheTurnOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		co, s, wg := busy(t)
		// A waiter whose context is already done by the time its turn
		// comes: it must hand the turn to the one behind it.
		gone, cancel := context.WithCancel(t.Context())
		wg.Go(func() { co.Do(gone, []int{2}, s.send, nil) })
		synctest.Wait()
		var behind []int
		wg.Go(func() { behind = co.Do(t.Context(), []int{3}, s.send, nil) })
		synctest.Wait()
		cancel()
		s.gate <- struct{}{}
		synctest.Wait()
		s.gate <- struct{}{}
		wg.Wait()
		if !slices.Equal(behind, []int{30}) {
			t.Errorf("the caller behind one that left got %v, want [30]", behind)
		}
	})
}

func TestAMergedBatchRunsToTheLatestOfItsCallersDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		co, s, wg := busy(t)
		now := time.Now()
		for _, d := range []time.Duration{time.Minute, 2 * time.Minute} {
			ctx, cancel := context.WithTimeout(t.Context(), d)
			defer cancel()
			wg.Go(func() { co.Do(ctx, []int{int(d / time.Minute)}, s.send, nil) })
		}
		synctest.Wait()
		s.gate <- struct{}{}
		synctest.Wait()
		if d, ok := s.ctxs[1].Deadline(); !ok || !d.Equal(now.Add(2*time.Minute)) {
			t.Errorf("the merged batch's deadline is %v (set: %t), want the later caller's, %v", d, ok, now.Add(2*time.Minute))
		}
		if _, ok := s.ctxs[0].Deadline(); ok {
			t.Error("a lone caller without a deadline got one")
		}
		s.gate <- struct{}{}
		wg.Wait()
	})
}

// endsWhenAsked is a context that ends the first time it is asked for its
// error once armed: a caller whose context ends just after it was handed
// the turn to send, before the sender looks at it.
type endsWhenAsked struct {
	context.Context
	cancel context.CancelFunc
	armed  atomic.Bool
}

func (c *endsWhenAsked) Err() error {
	if c.armed.Load() {
		c.cancel()
	}
	return c.Context.Err()
}

// TestACallerLeftOutOfTheBatchItWasToSendReturnsAtOnce: a caller handed
// the turn to send whose context has ended is not in the batch; it must
// not be held sending it for the others (found by an outside review).
func TestACallerLeftOutOfTheBatchItWasToSendReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		co, s, wg := busy(t)
		inner, cancel := context.WithCancel(t.Context())
		a := &endsWhenAsked{Context: inner, cancel: cancel}
		returned := make(chan []int, 1)
		go func() { returned <- co.Do(a, []int{2}, s.send, nil) }()
		synctest.Wait()
		var behind []int
		wg.Go(func() { behind = co.Do(t.Context(), []int{3}, s.send, nil) })
		synctest.Wait()
		a.armed.Store(true)
		s.gate <- struct{}{} // the first batch returns: a is handed the turn
		synctest.Wait()
		select {
		case got := <-returned:
			if got != nil {
				t.Errorf("the caller left out got %v, want nil", got)
			}
		default:
			t.Errorf("batches %v: the caller left out has not returned while the batch it is not in is in flight", s.batches)
		}
		s.gate <- struct{}{}
		wg.Wait()
		if !slices.Equal(behind, []int{30}) {
			t.Errorf("the caller behind got %v, want [30]", behind)
		}
	})
}

// Wait outlasts a merged batch whose callers all left: a Claimer's Close
// waits for it, so that what the batch undoes still reaches the server.
func TestWaitOutlastsABatchItsCallersLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		co, s, wg := busy(t)
		ctx, cancel := context.WithCancel(t.Context())
		undone := 0
		for v := range 2 {
			wg.Go(func() { co.Do(ctx, []int{v + 2}, s.send, func([]int) { undone++ }) })
		}
		synctest.Wait()
		s.gate <- struct{}{} // the two go together
		synctest.Wait()
		cancel() // and both leave
		wg.Wait()
		waited := make(chan struct{})
		go func() { co.Wait(); close(waited) }()
		synctest.Wait()
		select {
		case <-waited:
			t.Fatal("Wait returned with a batch in flight")
		default:
		}
		s.gate <- struct{}{}
		<-waited
		if undone != 2 {
			t.Errorf("%d shares abandoned to their undo before Wait returned, want 2", undone)
		}
	})
}

// A release does not wait behind a release batch out for longer than a
// round trip should take (a stalled backend): it goes at once, beside it,
// so that it waits in the server rather than in a process that may be
// killed meanwhile. Before that, the releases behind it merge as usual.
func TestAReleaseGoesBesideABatchStuckInTheBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var rc claim.ReleaseCoalescer
		gate := make(chan struct{})
		var mu sync.Mutex
		var batches []int // each batch's size
		send := func(ctx context.Context, ends []claim.Ending) []error {
			mu.Lock()
			batches = append(batches, len(ends))
			first := len(batches) == 1
			mu.Unlock()
			if first {
				<-gate // stuck
			}
			return make([]error, len(ends))
		}
		cl := func(i int) []*claim.Claim {
			return []*claim.Claim{{Run: claim.Run{Job: "job.stuck", At: time.Date(2026, 1, 2, 3, 4, i, 0, time.UTC)},
				Token: "t", Holder: "h", Fence: 1, Attempt: 1, Lease: time.Minute}}
		}
		release := func(i int) []error { return rc.Release(t.Context(), cl(i), []claim.Status{claim.Succeeded}, send) }
		var wg sync.WaitGroup
		wg.Go(func() { release(0) })
		synctest.Wait()
		wg.Go(func() { release(1) }) // merges: the batch is young
		synctest.Wait()
		mu.Lock()
		if len(batches) != 1 {
			t.Fatalf("batches %v: a release went beside a batch out for no time", batches)
		}
		mu.Unlock()
		time.Sleep(time.Second) // the batch is stuck
		if errs := release(2); errs[0] != nil {
			t.Fatal(errs[0])
		}
		mu.Lock()
		if len(batches) != 2 || batches[1] != 1 {
			t.Fatalf("batches %v, want the release behind a stuck batch sent at once, alone", batches)
		}
		mu.Unlock()
		close(gate)
		wg.Wait()
	})
}
