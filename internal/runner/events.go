// This file owns what the runner reports about runs: the statuses, skip
// reasons and events (Observe), their log lines and metrics (skip,
// finished, runAttrs), and the warning that the backend lost its data.

package runner

import (
	"context"
	"log/slog"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Skip reasons.
const (
	ReasonHeld    = "held"
	ReasonDone    = "done"
	ReasonOverlap = "overlap"
	ReasonPaused  = "paused"
	// ReasonMissed is a run that passed its deadline before any replica
	// could start it, recorded as claim.Missed; Event.Cause says why.
	ReasonMissed = "missed"
	// ReasonMisfire is how the `run skipped` log line and
	// scheduler_runs_skipped_total name a missed run: DESIGN.md's word
	// for an instant ended by its misfire policy. The line's `cause` and
	// scheduler_runs_missed_total's reason say why it misfired.
	ReasonMisfire = "misfire"
)

// Why a run was missed (Event.Cause, the reason label of
// scheduler_runs_missed_total).
const (
	// MissedNoReplica: no replica was up at the instant, seen at start-up.
	MissedNoReplica = "no_replica"
	// MissedUnavailable: the backend could not be reached until after
	// the deadline.
	MissedUnavailable = "backend_unavailable"
	// MissedBehind: the replica that dispatched or won the run fell
	// behind (a stalled process, a slow claim batch).
	MissedBehind = "fell_behind"
)

// Event kinds.
const (
	EventStarted  = "started"
	EventReturned = "returned" // the handler returned; its release follows
	EventFinished = "finished"
	EventSkipped  = "skipped"
)

// Event reports what happened to a run on this replica.
type Event struct {
	Kind   string
	Run    claim.Run
	Claim  *claim.Claim // nil for skips before a grant
	Status claim.Status // for EventFinished: how the run ended on this replica
	Reason string       // for EventSkipped
	Cause  string       // for EventSkipped with ReasonMissed: MissedNoReplica, …
	Err    error
	// Ran is how long the handler ran (EventFinished; 0 if it never
	// started). The event itself comes after the release.
	Ran time.Duration
}

// emit hands e to Options.Observe, if set.
func (r *Runner) emit(e Event) {
	if r.opts.Observe != nil {
		r.opts.Observe(e)
	}
}

// skip reports that run is skipped here for reason: logged at level,
// counted, and emitted. ctx is Run's; it only carries values to the
// logger.
func (d *dispatcher) skip(ctx context.Context, run claim.Run, cl *claim.Claim, reason string, level slog.Level) {
	r := d.r
	// Losers hear done for most runs, at debug: build the line only if it
	// is logged.
	if r.opts.Logger.Enabled(ctx, level) {
		r.opts.Logger.Log(ctx, level, "run skipped", append(runAttrs(r, run, cl), "reason", reason)...)
	}
	r.opts.Metrics.skipped(run.Job, reason)
	r.emit(Event{Kind: EventSkipped, Run: run, Claim: cl, Reason: reason})
}

// missed reports that run, won by cl, passed its deadline for cause and
// is recorded missed: logged at warn once fleet-wide (only the winner of
// the run reports it) as DESIGN.md's `run skipped` with reason misfire,
// counted, and emitted.
func (d *dispatcher) missed(ctx context.Context, run claim.Run, cl *claim.Claim, cause string) {
	r := d.r
	r.opts.Logger.WarnContext(ctx, "run skipped", append(runAttrs(r, run, cl), "reason", ReasonMisfire, "cause", cause)...)
	r.opts.Metrics.missed(run.Job, cause, 1)
	r.emit(Event{Kind: EventSkipped, Run: run, Claim: cl, Reason: ReasonMissed, Cause: cause})
}

// finished reports the final status of a run granted here: logged,
// counted, and emitted. ctx only carries values to the logger (the run's
// span, where it has one).
func (d *dispatcher) finished(ctx context.Context, cl *claim.Claim, status claim.Status, elapsed time.Duration, err error) {
	r := d.r
	attrs := append(runAttrs(r, cl.Run, cl), "status", status, "duration_ms", elapsed.Milliseconds())
	level := slog.LevelInfo
	if err != nil {
		attrs = append(attrs, "error", err.Error())
		level = slog.LevelWarn
	}
	r.opts.Logger.Log(ctx, level, "run finished", attrs...)
	r.opts.Metrics.finished(cl.Run.Job, status, elapsed)
	r.emit(Event{Kind: EventFinished, Run: cl.Run, Claim: cl, Status: status, Err: err, Ran: elapsed})
}

// runAttrs are the keys every run event carries (DESIGN.md, "Log events").
func runAttrs(r *Runner, run claim.Run, cl *claim.Claim) []any {
	a := []any{"job", run.Job, "scheduled_at", run.At.UTC().Format(time.RFC3339Nano),
		"run_id", run.ID(), "instance", r.opts.Instance, "claimer", r.opts.ClaimerName}
	if cl != nil {
		a = append(a, "fence", cl.Fence, "attempt", cl.Attempt)
	}
	return a
}

// dataLost warns, once per loss, that the backend lost its data: every
// run is held by it for a while, which is safe but deserves an operator's
// eye (the done markers of runs finished just before went too). Every run
// in flight reports the same loss; the first report warns and counts.
func (r *Runner) dataLost(ctx context.Context, loss *claim.DataLossError) {
	r.mu.Lock()
	first := loss.Until.After(r.lossUntil)
	if first {
		r.lossUntil = loss.Until
	}
	r.mu.Unlock()
	if !first {
		return
	}
	r.opts.Metrics.dataLost(r.opts.ClaimerName)
	r.log.WarnContext(ctx, "claimer backend lost its data", "instance", r.opts.Instance, "claimer", r.opts.ClaimerName,
		"held_until", loss.Until.UTC().Format(time.RFC3339Nano), "error", loss.Error())
}

// takeoversHeld reports whether the claimer holds takeovers of lapsed
// leases back now (claim.TakeoverHolder): a lapsed lease then reads as
// held.
func (r *Runner) takeoversHeld() bool { return claim.HeldBy(r.opts.Claimer, r.opts.Lease) }

// watchHold says when the claimer starts and stops holding takeovers of
// lapsed leases back (claim.TakeoverHolder), in the log and as a gauge,
// until ctx ends. A dead holder's runs wait meanwhile; without a word an
// operator would see only lag after a stall. The hold lasts at least a
// lease once the backend answers again, so a look every quarter lease
// sees every one.
func (r *Runner) watchHold(ctx context.Context, th claim.TakeoverHolder) {
	t := time.NewTicker(max(r.opts.Lease/4, 10*time.Millisecond))
	defer t.Stop()
	// A claimer starts held (claim.Unanswered.Start): said at info, as
	// every start has it, not as a warning of a backend that stalled.
	held := th.TakeoversHeld(r.opts.Lease)
	r.opts.Metrics.holdingTakeovers(r.opts.ClaimerName, held)
	if held {
		r.log.InfoContext(ctx, "takeovers held", "instance", r.opts.Instance, "claimer", r.opts.ClaimerName,
			"reason", "starting: a lapsed lease is taken over only once the backend has answered this replica for a lease, so that a release sent before it started lands first")
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := th.TakeoversHeld(r.opts.Lease)
		if now == held {
			continue
		}
		held = now
		r.opts.Metrics.holdingTakeovers(r.opts.ClaimerName, held)
		if held {
			r.log.WarnContext(ctx, "takeovers held", "instance", r.opts.Instance, "claimer", r.opts.ClaimerName,
				"reason", "the backend left calls unanswered: a lapsed lease is taken over only once it has answered for a lease, so that its holder's release lands first")
		} else {
			r.log.InfoContext(ctx, "takeovers resumed", "instance", r.opts.Instance, "claimer", r.opts.ClaimerName)
		}
	}
}
