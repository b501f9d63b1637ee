// This file owns catching up after an outage under misfire: run-all: the
// newest max_catchup instants missed while no replica was up run, oldest
// first, each once; the older ones are recorded missed.
//
// Every replica that starts walks the same instants in the same order and
// contends for each in turn, standing by while another replica runs it,
// and moves on only once it has ended: so however many replicas start
// together, each instant is claimed, and run, once, and no two overlap.

package runner

import (
	"context"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// catchUp runs the instants of j after last (its newest scheduled run
// recorded, zero if none) up to now under run-all. Without a record to
// count from (a new job, a pruned history) only the latest instant runs,
// as under run-once: nothing says the earlier ones were missed. A paused
// job catches nothing up: its latest instant is dispatched, and recorded
// skipped.
func (d *dispatcher) catchUp(ctx, execCtx context.Context, j *jobState, last, now time.Time) {
	r := d.r
	prev := j.Schedule.Prev(now, max(j.Grace, r.lateTolerance()))
	if r.paused(ctx, j.Name) {
		d.start(ctx, execCtx, j, prev, origin{late: MissedNoReplica}, 0)
		return
	}
	var due []time.Time
	if last.IsZero() {
		if !prev.IsZero() {
			due = append(due, prev)
		}
	} else {
		for at := j.Schedule.Next(last); !at.IsZero() && at.Before(now) && len(due) < maxMissedAtStart+j.MaxCatchup; at = j.Schedule.Next(at) {
			due = append(due, at)
		}
	}
	// The newest MaxCatchup within the grace run; the rest are missed.
	keep := len(due)
	for keep > 0 && len(due)-keep < j.MaxCatchup && now.Sub(due[keep-1]) <= max(j.Grace, r.lateTolerance()) {
		keep--
	}
	var missed []claim.Run
	for _, at := range due[:keep] {
		missed = append(missed, claim.Run{Job: j.Name, At: at.UTC()})
	}
	d.recordMissedRuns(ctx, j, missed, 0, last)
	if catch := due[keep:]; len(catch) > 0 {
		if len(catch) > 1 {
			r.log.InfoContext(ctx, "catching up missed runs", "job", j.Name, "instance", r.opts.Instance,
				"count", len(catch), "from", catch[0].UTC().Format(time.RFC3339Nano))
		}
		d.standby.Go(func() {
			for _, at := range catch {
				if !d.inTurn(ctx, execCtx, j, at) {
					return
				}
			}
		})
	}
}

// inTurn contends for j's run at and returns once it has ended, here or
// elsewhere, or false if ctx (Run's) ended first.
func (d *dispatcher) inTurn(ctx, execCtx context.Context, j *jobState, at time.Time) bool {
	run := claim.Run{Job: j.Name, At: at.UTC()}
	j.setLive(at, watching, +1)
	d.contend(ctx, execCtx, j, run, origin{late: MissedNoReplica, catchup: true}, "")
	j.setLive(at, watching, -1)
	// Won here, it still executes: wait for it before the next.
	for j.isLive(at) {
		if !sleep(ctx, 50*time.Millisecond) {
			return false
		}
	}
	return ctx.Err() == nil
}
