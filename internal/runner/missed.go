// This file owns what start-up learns from a job's history: the instants
// missed while no replica was up, beyond the one the look-back dispatches,
// and the job's last success for freshness alerts.

package runner

import (
	"context"
	"errors"
	"sync"
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
func (d *dispatcher) startupHistory(ctx, execCtx context.Context, j *jobState, recs []claim.Record, now time.Time) {
	for _, rec := range recs {
		if rec.Status == claim.Succeeded {
			d.r.opts.Metrics.succeeded(j.Name, rec.FinishedAt)
			break
		}
	}
	// Count from the newest scheduled run recorded before the late
	// tolerance and before the look-back instant: those may be claimed
	// right now, by this replica's look-back (every replica that starts
	// dispatches it) or by replicas already up, and their records say
	// nothing about the outage before them.
	bound := now.Add(-d.r.lateTolerance())
	if prev := d.r.lookBack(j, now); !prev.IsZero() && prev.Before(bound) {
		bound = prev
	}
	var last time.Time
	for _, rec := range recs {
		if !control.Manual(claim.Run{Job: rec.Job, At: rec.At}) && rec.At.Before(bound) {
			last = rec.At
			break
		}
	}
	if j.Misfire == MisfireRunAll {
		d.catchUp(ctx, execCtx, j, last, now)
		return
	}
	if !last.IsZero() {
		d.recordMissed(ctx, execCtx, j, last, now)
	}
	// No scheduled run recorded before then among the newest: a new job,
	// one whose history was pruned, or one so frequent that the probe
	// cannot tell; nothing to count from.
}

// recordMissed records as missed, reason no_replica, every instant of j
// after last (its newest recorded scheduled run) that no replica claimed
// and that is past the late tolerance; the later ones, but for the latest
// (the look-back dispatches it under the misfire policy), are dispatched
// like any run: still on time, they run. Each is claimed first, so
// however many replicas start together, and whatever replicas already up
// do, one records it and counts it. A paused job misses nothing; its
// instants still on time are dispatched all the same, and dispatch skips
// them as paused (claimed and released skipped). Left alone, such an
// instant could keep a grant nobody holds: a claim this replica sent
// before it crashed, delayed in a stalled backend, can land after the
// restart, and only a replica that contends for the instant watches that
// grant's lease and takes the run over when it lapses (explorer seed
// 41429).
func (d *dispatcher) recordMissed(ctx, execCtx context.Context, j *jobState, last, now time.Time) {
	r := d.r
	paused := r.paused(ctx, j.Name)
	prev := r.lookBack(j, now)
	end := now.Add(-r.lateTolerance())
	var runs []claim.Run
	beyond := 0
walk:
	for at := j.Schedule.Next(last); !at.IsZero() && at.Before(now); at = j.Schedule.Next(at) {
		switch {
		case at.Equal(prev):
		case !at.Before(end):
			d.start(ctx, execCtx, j, at, origin{late: MissedNoReplica}, 0)
		case paused:
		case len(runs) < maxMissedAtStart:
			runs = append(runs, claim.Run{Job: j.Name, At: at.UTC()})
		default:
			beyond++
			if beyond >= maxMissedAtStart {
				break walk // counted enough to say it was long
			}
		}
	}
	// In the background: start-up walks every job in turn, and the
	// claims and releases that record one job's instants, waited for
	// here, held up the dispatch of every later job's instants still on
	// time; with 2,000 jobs, some passed the late tolerance meanwhile and
	// were recorded missed too (an outside review).
	d.goStandby(func() { d.recordMissedRuns(ctx, execCtx, j, runs, beyond, last, MissedNoReplica) })
}

// recordMissedRuns records runs, j's instants since last that no replica
// claimed, as missed (for reason: no_replica, fell_behind), and logs and
// counts them once; beyond is how many more were not recorded.
func (d *dispatcher) recordMissedRuns(ctx, execCtx context.Context, j *jobState, runs []claim.Run, beyond int, last time.Time, reason string) {
	r := d.r
	if len(runs) == 0 && beyond == 0 {
		return
	}
	recorded := 0
	for len(runs) > 0 && ctx.Err() == nil {
		chunk := runs[:min(len(runs), missedChunk)]
		runs = runs[len(chunk):]
		recorded += d.recordChunk(ctx, execCtx, j, chunk, reason)
	}
	if recorded == 0 && beyond == 0 {
		return
	}
	r.opts.Metrics.missed(j.Name, reason, recorded)
	attrs := []any{"job", j.Name, "instance", r.opts.Instance, "claimer", r.opts.ClaimerName,
		"reason", ReasonMisfire, "cause", reason, "count", recorded, "since", last.UTC().Format(time.RFC3339Nano)}
	if beyond > 0 {
		attrs = append(attrs, "not_recorded", beyond)
	}
	r.log.WarnContext(ctx, "runs skipped", attrs...)
}

// recordChunk claims runs and releases the ones it wins as missed,
// but for a run granted as a takeover (attempt > 1): it had started, on a
// replica that died since, and is run to its end, never missed;
// retrying those the backend did not answer (a loaded backend times out
// a batch) until ctx (Run's) ends. It returns how many it recorded.
func (d *dispatcher) recordChunk(ctx, execCtx context.Context, j *jobState, runs []claim.Run, reason string) int {
	r := d.r
	recorded := 0
	for attempt := 0; len(runs) > 0; attempt++ {
		// Marked before the bid: a grant is visible to other probes as
		// soon as the backend makes it.
		j.setRecording(runs, +1)
		cctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
		cls, errs := r.opts.Claimer.Claim(cctx, runs, r.opts.Lease)
		cancel()
		var won []*claim.Claim
		var retry []claim.Run
		for i, cl := range cls {
			if errs[i] != nil || cl.Attempt > 1 {
				j.setRecording(runs[i:i+1], -1)
			}
			switch {
			case errs[i] == nil && cl.Attempt > 1:
				d.granted(ctx, execCtx, j, cl, origin{takeover: true})
			case errs[i] == nil:
				won = append(won, cl)
			case attempt > 0 && errors.Is(errs[i], claim.ErrHeld):
				// Held after a bid whose answer was lost: the holder may
				// be that bid's own grant, which nobody else watches (it
				// may be on no other replica's schedule). Stand by for it
				// like start-up's recovery does for a live run: whoever
				// holds it ends it, or its lease lapses and it is taken
				// over (explorer seed 51737).
				d.start(ctx, execCtx, j, runs[i].At, origin{takeover: true}, 0)
			case errors.Is(errs[i], claim.ErrHeld), errors.Is(errs[i], claim.ErrDone), errors.Is(errs[i], claim.ErrInvalid):
				// Someone else has it, or it is settled.
			default:
				retry = append(retry, runs[i])
			}
		}
		// Each release retries until the backend answers, batched with
		// the others: a claim left to expire would leave the run live,
		// and a takeover would run it (attempt 2 is never missed).
		var ended sync.WaitGroup
		var mu sync.Mutex
		for _, cl := range won {
			ended.Go(func() {
				defer j.setRecording([]claim.Run{cl.Run}, -1)
				if d.release(ctx, cl, claim.Missed) == nil {
					mu.Lock()
					recorded++
					mu.Unlock()
					r.emit(Event{Kind: EventSkipped, Run: cl.Run, Claim: cl, Reason: ReasonMissed, Cause: reason})
				}
			})
		}
		ended.Wait()
		runs = retry
		if len(runs) == 0 {
			break
		}
		t := time.NewTimer(jitter(min(r.opts.RenewEvery, time.Duration(1<<min(attempt, 6))*50*time.Millisecond)))
		select {
		case <-ctx.Done():
			t.Stop()
			return recorded
		case <-t.C:
		}
	}
	return recorded
}

// fellBehind handles j's instants from at, the first one due, up to now,
// when the loop woke past the late tolerance (the process was stopped or
// starved, the clock jumped). The latest is dispatched under the misfire
// policy; the ones before it still on time are dispatched like any run;
// the rest are claimed, and the ones no replica had run or claimed are
// recorded missed, reason fell_behind: every replica may have been stopped
// at once, and nothing else would ever record them (start-up counts
// missed runs only after the newest record). Like start-up, it records at
// most maxMissedAtStart of them and counts as many more, and records
// none of a paused job's. Under run-all too: catching up is start-up's,
// after the fleet was down.
func (d *dispatcher) fellBehind(ctx, execCtx context.Context, j *jobState, at, now time.Time) {
	r := d.r
	latest := j.Schedule.Prev(now, now.Sub(at))
	end := now.Add(-r.lateTolerance())
	// Those past the tolerance: walked, claimed and recorded on a
	// goroutine of their own (a frequent job after a long stall has
	// thousands), not in the loop.
	d.goStandby(func() {
		// A paused job misses nothing, as at start-up (recordMissed).
		paused := r.paused(ctx, j.Name)
		var missed []claim.Run
		beyond := 0
		for x := at; !x.IsZero() && x.Before(latest) && x.Before(end) && beyond < maxMissedAtStart; x = j.Schedule.Next(x) {
			switch {
			case !j.fire(x).Before(end):
				d.dispatch(ctx, execCtx, j, x, "") // jittered to within the tolerance
			case paused:
			case len(missed) < maxMissedAtStart:
				missed = append(missed, claim.Run{Job: j.Name, At: x.UTC()})
			default:
				beyond++
			}
		}
		d.recordMissedRuns(ctx, execCtx, j, missed, beyond, at, MissedBehind)
	})
	// The instants still on time, as any run (fire(x) >= x).
	for x := j.Schedule.Next(end.Add(-time.Nanosecond)); !x.IsZero() && x.Before(latest); x = j.Schedule.Next(x) {
		d.dispatch(ctx, execCtx, j, x, "")
	}
	d.dispatch(ctx, execCtx, j, latest, MissedBehind)
}

// lookBack is j's look-back instant at start-up (now): its latest
// instant within the grace or the late tolerance, whichever is longer;
// zero if none. Start-up dispatches it under the misfire policy, and
// counts the outage's missed instants up to it.
func (r *Runner) lookBack(j *jobState, now time.Time) time.Time {
	return j.Schedule.Prev(now, max(j.Grace, r.lateTolerance()))
}

// setRecording marks runs, instants of j, as claimed here only to be
// recorded missed (delta +1), or no longer (-1).
func (j *jobState) setRecording(runs []claim.Run, delta int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.recording == nil {
		j.recording = map[int64]int{}
	}
	for _, run := range runs {
		k := run.At.UnixNano()
		if j.recording[k] += delta; j.recording[k] <= 0 {
			delete(j.recording, k)
		}
	}
}

// recordingHere reports whether this replica holds, or is bidding for,
// j's run at only to record it missed.
func (j *jobState) recordingHere(at time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.recording[at.UnixNano()] > 0
}
