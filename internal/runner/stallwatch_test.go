package runner_test

import (
	"sync"
	"testing"
	"time"
)

// stallWatch measures how late a 10ms ticker fires: how long the test
// process went without being scheduled.
type stallWatch struct {
	mu   sync.Mutex
	gaps []stallGap
}

type stallGap struct {
	at  time.Time
	gap time.Duration
}

func watchStalls(t *testing.T) *stallWatch {
	w := &stallWatch{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		const every = 10 * time.Millisecond
		tk := time.NewTicker(every)
		defer tk.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-tk.C:
				if gap := now.Sub(last) - every; gap > 20*time.Millisecond {
					w.mu.Lock()
					w.gaps = append(w.gaps, stallGap{now, gap})
					w.mu.Unlock()
				}
				last = now
			}
		}
	})
	t.Cleanup(func() { close(done); wg.Wait() })
	return w
}

// worst is the longest stall between from and to.
func (w *stallWatch) worst(from, to time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for _, g := range w.gaps {
		if !g.at.Before(from) && !g.at.After(to) {
			d = max(d, g.gap)
		}
	}
	return d
}
