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
	"slices"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// catchUp runs the instants of j after last (its newest scheduled run
// recorded, zero if none) up to now under run-all. Without a record to
// count from (a new job, a pruned history) only the latest instant runs,
// as under run-once: nothing says the earlier ones were missed. A paused
// job catches nothing up: its latest instant is dispatched, and recorded
// skipped, and so are its instants since last that are still on time, as
// recordMissed does under run-once: a claim of one sent before a crash
// can land after the restart, and only a replica contending for it
// watches that grant.
func (d *dispatcher) catchUp(ctx, execCtx context.Context, j *jobState, last, now time.Time) {
	r := d.r
	prev := r.lookBack(j, now)
	if r.paused(ctx, j.Name) {
		from := now.Add(-r.lateTolerance() - time.Nanosecond)
		if last.After(from) {
			from = last
		}
		for at := j.Schedule.Next(from); !at.IsZero() && at.Before(now); at = j.Schedule.Next(at) {
			if !at.Equal(prev) {
				d.start(ctx, execCtx, j, at, origin{late: MissedNoReplica}, 0)
			}
		}
		d.start(ctx, execCtx, j, prev, origin{late: MissedNoReplica}, 0)
		return
	}
	// The newest MaxCatchup instants within the grace (and after last)
	// run, found walking back from now, so an outage of any length costs
	// as much; the ones before them, back to last, are missed.
	window := max(j.Grace, r.lateTolerance())
	oldest := now.Add(-window)
	var catch []time.Time
	for t := now; len(catch) < j.MaxCatchup; {
		at := j.Schedule.Prev(t, t.Sub(oldest))
		if at.IsZero() || !last.IsZero() && !at.After(last) {
			break
		}
		catch = append([]time.Time{at}, catch...)
		t = at.Add(-time.Nanosecond)
		if last.IsZero() {
			break // nothing says the earlier ones were missed
		}
	}
	var missed []claim.Run
	beyond := 0
	if !last.IsZero() {
		until := now
		if len(catch) > 0 {
			until = catch[0]
		}
		// The newest maxMissedAtStart before them are recorded, walking
		// back; the older ones are counted, up to as many again.
		for t := until.Add(-time.Nanosecond); len(missed) < maxMissedAtStart; {
			at := j.Schedule.Prev(t, t.Sub(last))
			if at.IsZero() || !at.After(last) {
				break
			}
			missed = append(missed, claim.Run{Job: j.Name, At: at.UTC()})
			t = at.Add(-time.Nanosecond)
		}
		slices.Reverse(missed)
		if len(missed) == maxMissedAtStart {
			for at := j.Schedule.Next(last); !at.IsZero() && at.Before(missed[0].At) && beyond < maxMissedAtStart; at = j.Schedule.Next(at) {
				beyond++
			}
		}
	}
	for _, at := range catch {
		j.runsAtStart(at)
	}
	if len(catch) > 1 {
		r.log.InfoContext(ctx, "catching up missed runs", "job", j.Name, "instance", r.opts.Instance,
			"count", len(catch), "from", catch[0].UTC().Format(time.RFC3339Nano))
	}
	// The instants missed are recorded first, then the caught-up ones run
	// in turn, in the background, as recordMissed's are: start-up must
	// not wait on one job's claims before it dispatches the next job's
	// instants still on time.
	d.goStandby(func() {
		d.recordMissedRuns(ctx, execCtx, j, missed, beyond, last, MissedNoReplica)
		for _, at := range catch {
			if !d.inTurn(ctx, execCtx, j, at) {
				return
			}
		}
	})
}

// inTurn contends for j's run at and returns once it has ended, here or
// elsewhere, or false if ctx (Run's) ended first.
func (d *dispatcher) inTurn(ctx, execCtx context.Context, j *jobState, at time.Time) bool {
	run := claim.Run{Job: j.Name, At: at.UTC()}
	o := origin{late: MissedNoReplica, catchup: true}
	j.watch(at, o)
	d.contend(ctx, execCtx, j, run, o, "")
	j.setLive(at, watching, -1)
	// Won here, it still executes: wait for it before the next.
	for j.isLive(at) {
		if !sleep(ctx, 50*time.Millisecond) {
			return false
		}
	}
	return ctx.Err() == nil
}
