package runner

import (
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
