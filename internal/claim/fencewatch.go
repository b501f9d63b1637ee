package claim

import (
	"fmt"
	"sync"
)

// FenceWatch tells a claimer whose fences come from one counter (the SQL
// backends' sequence) that its backend went back in time: a backup
// restored under running replicas, or another server answering (a
// multi-host DSN over servers that do not replicate). Fences only grow, so
// every grant must come out above every fence seen before its request was
// sent. One that does not means the backend forgot grants, and whatever it
// grants now may be a run some replica still runs: the claimer stops for
// good (Lost), and its process exits for its supervisor to restart it.
// What a grant must be above is what had been seen when its request was
// sent (Mark): grants in flight at once may come back in any order.
//
// The zero value is ready to use.
type FenceWatch struct {
	mu    sync.Mutex
	high  int64
	lost  error
	gone  chan struct{}
	where string
}

// NewFenceWatch returns a watch whose loss names where (the backend).
func NewFenceWatch(where string) *FenceWatch {
	return &FenceWatch{where: where, gone: make(chan struct{})}
}

// Mark is the highest fence seen so far, for Granted to compare the
// fences of a request sent now with.
func (w *FenceWatch) Mark() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.high
}

// Granted checks the fences of the claims (nil ones skipped) granted to a
// request sent at mark, and returns the loss, if the backend went back in
// time now or before.
func (w *FenceWatch) Granted(mark int64, cls []*Claim) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, cl := range cls {
		if cl == nil {
			continue
		}
		if cl.Fence <= mark && w.lost == nil {
			w.lost = fmt.Errorf("%w: %s went back in time: fence %d was granted after %d"+
				" (a backup restored under running replicas, or another server answering?);"+
				" the runs since are forgotten, and this process claims nothing more from it;"+
				" set the fence sequence above every fence handed out before starting replicas again",
				ErrUnavailable, w.where, cl.Fence, mark)
			close(w.gone)
		}
		w.high = max(w.high, cl.Fence)
	}
	return w.lost
}

// Err is the loss, or nil.
func (w *FenceWatch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

// Lost is closed once the backend went back in time.
func (w *FenceWatch) Lost() <-chan struct{} { return w.gone }
