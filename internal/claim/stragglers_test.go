package claim_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Wait waits for every function running, those started while it waits
// too.
func TestStragglersWaitForWorkStartedWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s claim.Stragglers
		first, second := make(chan struct{}), make(chan struct{})
		s.Go(func() { <-first })
		var returned atomic.Bool
		go func() {
			s.Wait()
			returned.Store(true)
		}()
		synctest.Wait()
		s.Go(func() { <-second })
		close(first)
		synctest.Wait()
		if returned.Load() {
			t.Fatal("Wait returned while a function started during it was running")
		}
		close(second)
		synctest.Wait()
		if !returned.Load() {
			t.Fatal("Wait did not return once nothing ran")
		}
		s.Wait() // nothing running: returns at once
	})
}

// A Claimer closing while a claim in flight starts its batch or its undo:
// Go and Wait on goroutines with nothing ordering them. (A sync.WaitGroup
// here is a data race the race detector reports: it was found so, a
// replica of the explorer closing its redis claimer under a call that
// outlived its crash.)
func TestStragglersMayStartWhileWaitWaits(t *testing.T) {
	var s claim.Stragglers
	var ran atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 2000 {
				s.Go(func() { ran.Add(1) })
			}
		})
	}
	wg.Go(func() {
		for range 2000 {
			s.Wait()
		}
	})
	wg.Wait()
	s.Wait()
	if n := ran.Load(); n != 8000 {
		t.Fatalf("%d functions ran before the last Wait returned, want 8000", n)
	}
}
