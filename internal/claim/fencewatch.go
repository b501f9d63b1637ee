package claim

import (
	"fmt"
	"sync"
)

// FenceWatch tells a claimer whose fences come from one counter (the SQL
// backends' sequence or counter row) that its backend went back in time:
// a backup restored or a copy written over it under running replicas, or
// another server answering (a multi-host DSN over servers that do not
// replicate). Fences only grow, so every grant must come out above, and
// every read of the counter at least at, every fence seen before its
// request was sent. One that does not means the backend forgot grants,
// and whatever it grants now may be a run some replica still runs: the
// claimer stops for good (Lost), and its process exits for its
// supervisor to restart it. What a request must see is what had been seen
// when it was sent (Mark): requests in flight at once may come back in
// any order, and a read begun before a grant's commit may end after it.
type FenceWatch struct {
	where, hint string

	mu   sync.Mutex
	high int64
	lost error
	gone chan struct{}
}

// NewFenceWatch returns a watch whose loss names where (the backend) and
// says what may have happened (hint).
func NewFenceWatch(where, hint string) *FenceWatch {
	return &FenceWatch{where: where, hint: hint, gone: make(chan struct{})}
}

// Mark is the highest fence seen so far, for Granted or Observed to
// compare with when the request sent now comes back.
func (w *FenceWatch) Mark() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.high
}

// Granted records fences granted to a request sent at mark, and returns
// the loss if the backend went back in time, now or before.
func (w *FenceWatch) Granted(mark int64, fences ...int64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range fences {
		if f <= mark {
			w.wentBack(fmt.Sprintf("fence %d was granted after %d", f, mark))
		}
		w.high = max(w.high, f)
	}
	return w.lost
}

// Observed records counter value v, read by a request sent at mark, and
// returns the loss if the backend went back in time, now or before.
func (w *FenceWatch) Observed(mark, v int64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if v < mark {
		w.wentBack(fmt.Sprintf("the fence counter read %d after %d", v, mark))
	}
	w.high = max(w.high, v)
	return w.lost
}

func (w *FenceWatch) wentBack(what string) {
	w.lose(fmt.Errorf("%w: %s went back in time: %s (%s); the runs since are forgotten,"+
		" and this process claims nothing more from it", ErrUnavailable, w.where, what, w.hint))
}

// Lose stops the claimer for good for another reason (err: a file deleted
// under it), unless it stopped already; it returns the loss.
func (w *FenceWatch) Lose(err error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lose(err)
	return w.lost
}

func (w *FenceWatch) lose(err error) {
	if w.lost == nil {
		w.lost = err
		close(w.gone)
	}
}

// Err is the loss, or nil.
func (w *FenceWatch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

// Lost is closed once the claimer stopped for good.
func (w *FenceWatch) Lost() <-chan struct{} { return w.gone }
