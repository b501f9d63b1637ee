// This file owns what start-up learns from a job's history: the instants
// missed while no replica was up, beyond the one the look-back dispatches,
// and the job's last success for freshness alerts.

package runner

import (
	"context"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// maxMissedAtStart bounds how many missed instants of one job a replica
// records at start-up; a longer outage of a frequent job is logged with
// its count beyond that, not recorded run by run.
const maxMissedAtStart = 10_000

// missedChunk is how many missed instants go in one claim batch.
const missedChunk = 1000

// startupHistory reads what recs, j's newest records, say at start-up
// (now): the last success, and the instants missed since the newest
// scheduled run they hold.
func (d *dispatcher) startupHistory(ctx context.Context, j *jobState, recs []claim.Record, now time.Time) {
	for _, rec := range recs {
		if rec.Status == claim.Succeeded {
			d.r.opts.Metrics.succeeded(j.Name, rec.FinishedAt)
			break
		}
	}
	for _, rec := range recs {
		if !control.Manual(claim.Run{Job: rec.Job, At: rec.At}) {
			d.recordMissed(ctx, j, rec.At, now)
			return
		}
	}
	// No scheduled run recorded: a new job, or one whose history was
	// pruned; nothing to count from.
}

// recordMissed records as missed, reason no_replica, every instant of j
// after last (its newest recorded scheduled run) that no replica claimed:
// up to the late tolerance before now, when replicas up may still be
// dispatching it, and except the latest instant, which the look-back
// dispatches under the misfire policy. Each is claimed first, so however
// many replicas start together, one records it and counts it. A paused
// job misses nothing.
func (d *dispatcher) recordMissed(ctx context.Context, j *jobState, last, now time.Time) {
	r := d.r
	if r.paused(ctx, j.Name) {
		return
	}
	prev := j.Schedule.Prev(now, max(j.Grace, r.lateTolerance()))
	end := now.Add(-r.lateTolerance())
	var runs []claim.Run
	beyond := 0
walk:
	for at := j.Schedule.Next(last); !at.IsZero() && at.Before(end); at = j.Schedule.Next(at) {
		switch {
		case at.Equal(prev):
		case len(runs) < maxMissedAtStart:
			runs = append(runs, claim.Run{Job: j.Name, At: at.UTC()})
		default:
			beyond++
			if beyond >= maxMissedAtStart {
				break walk // counted enough to say it was long
			}
		}
	}
	if len(runs) == 0 {
		return
	}
	recorded := 0
	for len(runs) > 0 && ctx.Err() == nil {
		chunk := runs[:min(len(runs), missedChunk)]
		runs = runs[len(chunk):]
		cctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
		cls, _ := r.opts.Claimer.Claim(cctx, chunk, r.opts.Lease)
		cancel()
		var won []*claim.Claim
		for _, cl := range cls {
			if cl != nil {
				won = append(won, cl)
			}
		}
		if len(won) == 0 {
			continue
		}
		outs := make([]claim.Status, len(won))
		for i := range outs {
			outs[i] = claim.Missed
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.Lease)
		errs := r.opts.Claimer.Release(rctx, won, outs)
		cancel()
		for i, cl := range won {
			if errs[i] == nil {
				recorded++
				r.emit(Event{Kind: EventSkipped, Run: cl.Run, Claim: cl, Reason: ReasonMissed, Cause: MissedNoReplica})
			}
			// A failed release leaves the claim to expire; the run is
			// then taken over as attempt 2, which is never missed.
		}
	}
	if recorded == 0 && beyond == 0 {
		return
	}
	r.opts.Metrics.missed(j.Name, MissedNoReplica, recorded)
	attrs := []any{"job", j.Name, "instance", r.opts.Instance, "claimer", r.opts.ClaimerName, "reason", MissedNoReplica,
		"count", recorded, "since", last.UTC().Format(time.RFC3339Nano)}
	if beyond > 0 {
		attrs = append(attrs, "not_recorded", beyond)
	}
	r.log.WarnContext(ctx, "runs missed", attrs...)
}
