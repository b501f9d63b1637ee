package explore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
)

// herePlan is one `scheduler trigger --here` the operator runs in a
// replica's pod (kubectl exec): it shares that replica's link and host
// faults and dies with it. Nobody runs it again: a run it leaves live
// (killed, or stopped and its run handed back) is the fleet's to take
// over, though no replica dispatched it (the runner's sweep), or the
// checker finds it abandoned.
type herePlan struct {
	at      time.Duration // when it starts, from t0
	replica int
	job     string
	// stop is when the operator stops it (Ctrl-C), from its start; 0:
	// never. Stopped mid-run, it hands its run back interrupted. With
	// kill, it is killed instead (kill -9, its pod up): its run's lease
	// lapses.
	stop time.Duration
	kill bool
}

// drawHeres draws the seed's triggers from a stream of their own, so the
// nemesis plan and the other operator actions stay those the seed drew
// before triggers were explored. One seed in two has one or two; half of
// them start shortly before a fault of their replica's (a crash, a
// termination, a pause, a partition), so that the faults meet a trigger
// at work, and the operator stops half of them a moment after they start:
// Ctrl-C, or kill -9 of the process alone. Half of them run a job of their own, adhoc: no schedule
// instant of it falls in the history, and it allows overlap, so no overlap
// probe adopts a run of it either; only the sweep finds one left live.
func (w *world) drawHeres() []herePlan {
	if w.cfg.Plan != nil || w.cfg.NoHeres {
		return nil // a pinned plan replays the history it pinned
	}
	rng := rand.New(rand.NewPCG(w.cfg.Seed, 0x4e4e))
	if rng.IntN(2) == 0 {
		return nil
	}
	l := w.cfg.Lease
	hits := w.podFaults()
	w.adhoc = &jobDef{name: "adhoc", spec: "0 0 29 2 *", overlap: runner.OverlapAllow, misfire: runner.MisfireSkip,
		work: func(h uint64) time.Duration { return l/2 + time.Duration(h%uint64(3*l/2)) }}
	var hs []herePlan
	for range 1 + rng.IntN(2) {
		h := herePlan{at: l + time.Duration(rng.Int64N(int64(max(w.cfg.Faults-l, time.Second)))),
			replica: rng.IntN(w.cfg.Replicas), job: w.adhoc.name}
		if rng.IntN(2) == 0 {
			h.job = w.jobs[rng.IntN(len(w.jobs))].name
		}
		if rng.IntN(2) == 0 {
			h.stop = l/4 + time.Duration(rng.Int64N(int64(l)))
			h.kill = rng.IntN(2) == 0
		}
		if len(hits) > 0 && rng.IntN(2) == 0 {
			op := hits[rng.IntN(len(hits))]
			h.replica, h.at = op.Replica, op.At-time.Duration(rng.Int64N(int64(l/2)))
		}
		hs = append(hs, h)
	}
	return hs
}

// runHere runs h once, as a process named for it (here1, here2, … on
// replica rN), and logs how it ended.
func (w *world) runHere(ctx context.Context, h herePlan, n int) {
	if !sleepUntil(ctx, w.t0.Add(h.at)) {
		return
	}
	r := w.reps[h.replica]
	name := fmt.Sprintf("%s.here%d", r.id, n)
	var status claim.Status
	var alone atomic.Bool // killed alone, while its run went on
	ok, err := r.inPod(ctx, name, func(rctx context.Context, run *runner.Runner, kill func()) error {
		if h.stop > 0 {
			var cancel context.CancelFunc
			rctx, cancel = context.WithCancel(rctx)
			defer cancel()
			stop := func() {
				w.mu.Lock()
				if w.stopped == nil {
					w.stopped = map[string]time.Time{}
				}
				w.stopped[name] = time.Now()
				w.mu.Unlock()
				cancel()
			}
			if h.kill {
				stop = func() { alone.Store(true); kill() }
			}
			defer time.AfterFunc(h.stop, stop).Stop()
		}
		var err error
		status, err = run.Trigger(rctx, h.job, runner.TriggerOptions{By: "explorer"})
		return err
	})
	note := fmt.Sprintf("operator: trigger --here %s on %s: %s", h.job, name, status)
	switch {
	case h.stop > 0 && h.kill:
		note += fmt.Sprintf(" (killed after %.1fs, its pod up)", h.stop.Seconds())
	case h.stop > 0:
		note += fmt.Sprintf(" (stopped after %.1fs)", h.stop.Seconds())
	}
	if !ok {
		note += " (killed with its replica)"
	}
	if err != nil {
		note += ": " + err.Error()
	}
	w.log.Add(history.Event{Kind: history.Fault, Note: note})
	w.mu.Lock()
	w.heres++
	if !ok {
		w.heresKilled++
	} else if alone.Load() {
		w.heresAlone++
	}
	w.mu.Unlock()
}
