package runner

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// BidOrder is the order in which a replica named instance bids for runs
// due together (preferred), for the tests.
func BidOrder(instance string, runs []claim.Run, spread time.Duration) []claim.Run {
	r := &Runner{opts: Options{Instance: instance}}
	ready := make([]due, len(runs))
	for i, run := range runs {
		ready[i] = due{at: run.At, fire: run.At, job: &jobState{Job: Job{Name: run.Job}}}
	}
	r.preferred(ready, spread)
	out := make([]claim.Run, len(ready))
	for i, e := range ready {
		out[i] = claim.Run{Job: e.job.Name, At: e.at}
	}
	return out
}

// HoldFor is holdFor, for the tests.
var HoldFor = holdFor

// HistoryReader is a Run's coalescing history reader over r's claimer,
// for the tests: read reads through it, queued counts the reads waiting
// for a batch, wait waits for the batches to end.
func HistoryReader(r *Runner) (read func(ctx context.Context, job string, limit int) ([]claim.Record, error), queued func() int, wait func()) {
	var standby, exec sync.WaitGroup
	d := r.dispatcher(&standby, &exec)
	queued = func() int {
		d.reads.q.mu.Lock()
		defer d.reads.q.mu.Unlock()
		return len(d.reads.q.pending)
	}
	return d.reads.history, queued, exec.Wait
}

// ScheduleReadEvery is scheduleReadEvery, for the tests.
const ScheduleReadEvery = scheduleReadEvery

// WithHeldHere is withHeldHere for a job that executes held here, for the
// tests.
func WithHeldHere(page []claim.Record, held []claim.Record, self *claim.Claim) []claim.Record {
	j := &jobState{Job: Job{Name: self.Run.Job}, held: map[string]heldRun{}}
	for _, rec := range held {
		j.held[rec.RunID] = heldRun{rec: rec, trusted: new(atomic.Pointer[time.Time])}
	}
	return withHeldHere(page, j, self)
}
