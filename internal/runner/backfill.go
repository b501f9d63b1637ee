// This file owns backfill: running every instant of a job's schedule in a
// past range, on this process, through the same claims as the fleet, so an
// instant that already ran (here, on a replica, in an earlier backfill) is
// not run again unless a rerun policy says so.

package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// Rerun policies of a backfill: which instants that have a record it runs
// again. An instant with no record, or recorded missed (it never started),
// always runs.
const (
	RerunNone    = "none"    // nothing that started
	RerunFailed  = "failed"  // also those whose last run failed
	RerunSkipped = "skipped" // also those whose last run was skipped (paused, or for overlap): they never ran
	RerunAll     = "all"     // every instant
)

// RerunPolicies are the rerun policies, in the order a usage message
// lists them.
var RerunPolicies = []string{RerunNone, RerunFailed, RerunSkipped, RerunAll}

// MaxBackfill bounds the instants of one backfill.
const MaxBackfill = 100_000

// maxReruns is how many times one instant can be rerun: a rerun's run id is
// the instant plus k nanoseconds, k < maxReruns, which never names a
// scheduled instant (whole seconds) nor a requested one (at least a
// microsecond into its second, control.ManualInstant).
const maxReruns = 999

// BackfillOptions configure Backfill.
type BackfillOptions struct {
	From, To      time.Time // the range, both included
	Rerun         string    // one of RerunPolicies; RerunNone by default
	MaxConcurrent int       // instants run at once; default 1
	NewestFirst   bool
	DryRun        bool // plan only: claim and run nothing
	// Progress, when set, is called once per instant as it settles (in a
	// dry run, as it is planned), from one goroutine at a time.
	Progress func(BackfillItem, BackfillSummary)
	// Grace is how long the handlers running when ctx ends may go on
	// before they are cancelled and their runs handed back interrupted:
	// a replica's shutdown_grace, for a backfill the API started on it
	// (DESIGN.md's graceful shutdown); 0, at once. No instant starts
	// once ctx has ended.
	Grace time.Duration
}

// Backfill actions.
const (
	ActionRun   = "run"   // the instant never started
	ActionRerun = "rerun" // it did, and the rerun policy runs it again
	ActionKeep  = "keep"  // it did: left alone
	// ActionResume: it is recorded live (running, or handed back
	// interrupted), which no replica watches once its instant is past (a
	// backfill killed or stopped while it ran it): contended for, taken
	// over and run here once its holder's lease lapsed, left to a holder
	// that still renews it.
	ActionResume = "resume"
)

// BackfillItem is one instant of a backfill.
type BackfillItem struct {
	At     time.Time `json:"scheduled_at"`
	RunID  string    `json:"run_id"`        // the run claimed: the instant's, or a rerun's
	Action string    `json:"action"`        // ActionRun, ActionRerun, ActionKeep
	Was    string    `json:"was,omitempty"` // its recorded status before, if any
	// Status is how it ended here: a claim.Status, or "done" or "held"
	// when another process had it, or "error".
	Status string `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
}

// BackfillSummary counts a backfill's instants.
type BackfillSummary struct {
	Job       string `json:"job"`
	Instants  int    `json:"instants"`
	Planned   int    `json:"planned"` // to run or rerun
	Settled   int    `json:"settled"` // planned ones settled so far
	Succeeded int    `json:"succeeded"`
	Failed    int    `json:"failed"` // failed or timed out
	// Interrupted: stopped here before they ended (the backfill was),
	// handed back live (a retry not yet made included), or whose lease
	// was lost (the backend out of reach: a replica takes them over, or
	// a backfill run again resumes them).
	Interrupted int `json:"interrupted"`
	Elsewhere   int `json:"elsewhere"` // done or held by another process
	Errors      int `json:"errors"`
	Kept        int `json:"kept"`
}

// Forgotten says, if from reaches back further than forgets, how long a
// claimer keeps finished runs (key: the setting; 0: until pruned), why a
// backfill from there would run again what already ran. Backfill asks
// it of Options.Forgets, so every way in is held to it: the CLI (which
// asks first, to exit 2 before it opens the backend), the HTTP API (an
// outside review re-ran six finished runs through the API, which did
// not ask), an embedder.
func Forgotten(forgets time.Duration, key string, from, now time.Time) error {
	if forgets <= 0 {
		return nil
	}
	if oldest := now.Add(-forgets); from.Before(oldest) {
		return fmt.Errorf("is older than %s %v: runs that finished before %s are forgotten, and would run again; "+
			"narrow the range or raise %s", key, forgets, oldest.UTC().Format(time.RFC3339), key)
	}
	return nil
}

// CheckBackfill says what is wrong with a backfill of job name with o,
// if anything, without running it: what Backfill would refuse before it
// reads the history. The HTTP API asks it before it answers 202 and
// runs the backfill in the background.
func (r *Runner) CheckBackfill(name string, o BackfillOptions) error {
	_, _, err := r.backfillRange(name, &o, r.opts.Now())
	return err
}

// backfillRange checks a backfill's options (filling in the default
// rerun policy) at now, and returns its job and instants, in the order
// they are run.
func (r *Runner) backfillRange(name string, o *BackfillOptions, now time.Time) (*jobState, []time.Time, error) {
	j := r.job(name)
	if j == nil {
		return nil, nil, fmt.Errorf("backfill: unknown job %q", name)
	}
	o.Rerun = cmp.Or(o.Rerun, RerunNone)
	if !slices.Contains(RerunPolicies, o.Rerun) {
		return nil, nil, fmt.Errorf("backfill: rerun %q: want %s", o.Rerun, strings.Join(RerunPolicies, ", "))
	}
	switch {
	case o.From.IsZero() || o.To.IsZero():
		return nil, nil, errors.New("backfill: need both from and to, and neither may be the zero time (0001-01-01T00:00:00Z)")
	case o.To.Before(o.From):
		return nil, nil, fmt.Errorf("backfill: to %s is before from %s", o.To.Format(time.RFC3339), o.From.Format(time.RFC3339))
	case o.To.After(now):
		return nil, nil, fmt.Errorf("backfill: to %s is in the future; the replicas run what is due", o.To.Format(time.RFC3339))
	}
	if err := Forgotten(r.opts.Forgets, r.opts.ForgetsKey, o.From, now); err != nil {
		return nil, nil, fmt.Errorf("backfill: from %s %v", o.From.Format(time.RFC3339), err)
	}
	var instants []time.Time
	for at := j.Schedule.Next(o.From.Add(-time.Nanosecond)); !at.IsZero() && !at.After(o.To); at = j.Schedule.Next(at) {
		if len(instants) == MaxBackfill {
			return nil, nil, fmt.Errorf("backfill: more than %d instants of %s between %s and %s; split the range",
				MaxBackfill, name, o.From.Format(time.RFC3339), o.To.Format(time.RFC3339))
		}
		instants = append(instants, at.UTC())
	}
	if o.NewestFirst {
		slices.Reverse(instants)
	}
	return j, instants, nil
}

// Backfill runs the instants of job name between o.From and o.To that the
// rerun policy selects, claimed like any run, and returns what happened to
// each. It ignores the job's pause, overlap and misfire policies: it is an
// operator's explicit request for past instants, and MaxConcurrent bounds
// it instead.
func (r *Runner) Backfill(ctx context.Context, name string, o BackfillOptions) ([]BackfillItem, BackfillSummary, error) {
	sum := BackfillSummary{Job: name}
	now := r.opts.Now()
	j, instants, err := r.backfillRange(name, &o, now)
	if err != nil {
		return nil, sum, err
	}
	sum.Instants = len(instants)
	plan, err := r.planBackfill(ctx, j, instants, o.From, now, o.Rerun)
	if err != nil {
		return nil, sum, err
	}
	for _, it := range plan {
		if it.Action != ActionKeep {
			sum.Planned++
		} else {
			sum.Kept++
		}
	}
	if o.DryRun {
		for _, it := range plan {
			if o.Progress != nil {
				o.Progress(it, sum)
			}
		}
		return plan, sum, nil
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	d := r.dispatcher(&wg, &wg)
	// A backfill stopped mid-run (SIGTERM, Ctrl-C: ctx ends) hands its
	// runs back interrupted, as a replica's shutdown does: recorded
	// failed, a backfill run again would keep them (ActionKeep) though
	// they never finished; handed back, it resumes them (ActionResume).
	execCtx, done := handBackOnStop(ctx, o.Grace)
	defer done()
	var mu sync.Mutex
	sem := make(chan struct{}, max(o.MaxConcurrent, 1))
	var runs sync.WaitGroup
	for i := range plan {
		it := &plan[i]
		if it.Action == ActionKeep {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		runs.Go(func() {
			defer func() { <-sem }()
			run, _ := claim.ParseID(it.RunID)
			status, err := d.backfillOne(ctx, execCtx, j, run, it.Action == ActionResume)
			mu.Lock()
			defer mu.Unlock()
			it.Status = status
			sum.Settled++
			switch {
			case err != nil:
				it.Error = err.Error()
				sum.Errors++
			case status == string(claim.Succeeded):
				sum.Succeeded++
			case status == "done" || status == "held":
				sum.Elsewhere++
			case status == string(claim.Interrupted), status == string(claim.Retrying), status == string(claim.LeaseLost):
				// Handed back, waiting for a retry nobody here will make,
				// or its lease lost: live, for a replica to take over or
				// a backfill run again to resume. Not failed: nothing
				// said it failed (found by an outside review: a backfill
				// stopped during an outage said "1 failed").
				sum.Interrupted++
			default:
				sum.Failed++
			}
			if o.Progress != nil {
				o.Progress(*it, sum)
			}
		})
	}
	runs.Wait()
	return plan, sum, ctx.Err()
}

// backfillOne claims run and executes it here, under execCtx, if won.
// live: the run is recorded live (ActionResume), and a holder found is
// waited out.
func (d *dispatcher) backfillOne(ctx, execCtx context.Context, j *jobState, run claim.Run, live bool) (string, error) {
	c, err := d.carry(ctx, run, true)
	if err != nil {
		return "error", err // nothing bid, nothing ran
	}
	cl, err := d.claimUnwatched(ctx, run, live)
	switch {
	case errors.Is(err, claim.ErrDone):
		c.done(true)
		return "done", nil
	case errors.Is(err, claim.ErrHeld):
		c.done(false)
		return "held", nil
	case err != nil:
		c.done(false) // a grant whose answer was lost is the fleet's
		return "error", err
	}
	status, err := d.runToEnd(ctx, execCtx, j, cl, admitAlways, c)
	return string(status), err
}

// claimUnwatched claims run for work done here and now (a backfill, a
// trigger) that no replica's schedule watches: a past instant, a manual
// one.
//
// A bid whose answer was lost (a timeout, a dropped reply) may have been
// granted, and nothing else would ever watch that grant. Left alone, it
// would stay live until some replica's start-up recovery took it over and
// ran it, long after this caller reported an error for it. So such a bid
// is asked again until the backend answers, and a run then found held is
// asked for again until its holder could no longer be that lost grant (a
// lease and the clock skew after the backend answered again, following
// the last unanswered bid: a lost grant is never renewed, and a server
// that stalled may grant a queued bid only as it resumes): released, it
// is done; lapsed, it is taken over and
// granted here. A backend out of reach for three such windows still ends
// in an error.
//
// held says the run was recorded live before this call: its holder may
// have died (a backfill killed while it ran it), and nothing else would
// take it over. It is asked for in the same way from the start, as if a
// bid had just been lost: a holder that still renews it after the window
// keeps it (ErrHeld).
//
// A run recorded live, found held while this replica holds takeovers
// back (a process begun now, as a backfill's is: claim.Unanswered.Start),
// may be a lapsed lease it may not take yet, so it is asked for again
// until the hold ends, for three windows at most. One not recorded live
// (a trigger's new instant) is held by a live grant, or by the backend
// itself (a Redis server that may have restarted empty), and waiting
// out this replica's hold would only hide that.
func (d *dispatcher) claimUnwatched(ctx context.Context, run claim.Run, held bool) (*claim.Claim, error) {
	r := d.r
	window := r.opts.Lease + 2*r.opts.MaxClockSkew
	began := time.Now()
	var firstLost, lastLost time.Time
	if held {
		lastLost = time.Now()
	}
	lost := false // the last bid's answer was lost
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		cl, err := d.claim(ctx, run)
		switch {
		case err == nil, errors.Is(err, claim.ErrDone), errors.Is(err, claim.ErrInvalid), errors.Is(err, errClosing), ctx.Err() != nil:
			return cl, err
		case errors.Is(err, claim.ErrHeld):
			if lost {
				// The backend answers again. A bid lost before may have
				// been granted only now, not when it was sent: a stalled
				// server works off the requests it queued when it
				// resumes (explorer seed 201206: a backfill's bid, sent
				// in a 4s stall, granted as it ended; counted from its
				// send, the window closed while that grant still held
				// the run, and the backfill left it live for good as
				// "elsewhere"). So the window counts from this answer.
				lastLost, lost = time.Now(), false
			}
			waiting := held && claim.HeldBy(r.opts.Claimer, r.opts.Lease) && time.Since(began) < 3*window
			if !waiting && (lastLost.IsZero() || time.Since(lastLost) > window) {
				return nil, err
			}
		default:
			if firstLost.IsZero() {
				firstLost = sent
			}
			lastLost, lost = sent, true
			if time.Since(firstLost) > 3*window {
				return nil, err
			}
		}
		if !sleep(ctx, jitter(min(r.opts.RenewEvery, time.Duration(1<<min(attempt, 6))*50*time.Millisecond))) {
			return nil, err
		}
	}
}

// planBackfill decides each instant's action from the job's history.
func (r *Runner) planBackfill(ctx context.Context, j *jobState, instants []time.Time, from, now time.Time, rerun string) ([]BackfillItem, error) {
	// Enough records to reach back to from: every scheduled instant since,
	// each with room for reruns and requests.
	n := 0
	for at := j.Schedule.Next(from.Add(-time.Nanosecond)); !at.IsZero() && !at.After(now) && n < 10*MaxBackfill; at = j.Schedule.Next(at) {
		n++
	}
	recs, err := r.opts.Claimer.History(ctx, j.Name, 2*n+1000)
	if err != nil {
		return nil, fmt.Errorf("backfill: read history of %s: %w", j.Name, err)
	}
	type last struct {
		status claim.Status
		k      int // the latest rerun's k, 0 for the instant itself
	}
	seen := map[int64]last{}
	for _, rec := range recs {
		base := rec.At.Truncate(time.Second)
		k := int(rec.At.Sub(base))
		if control.Manual(claim.Run{At: rec.At}) && k >= maxReruns {
			continue // a requested run, not a rerun
		}
		if l, ok := seen[base.UnixNano()]; !ok || k >= l.k {
			seen[base.UnixNano()] = last{rec.Status, k}
		}
	}
	plan := make([]BackfillItem, 0, len(instants))
	for _, at := range instants {
		it := BackfillItem{At: at, RunID: claim.Run{Job: j.Name, At: at}.ID(), Action: ActionKeep}
		l, ok := seen[at.UnixNano()]
		if ok {
			it.Was = string(l.status)
		}
		switch {
		case !ok:
			it.Action = ActionRun
		case l.status.Live():
			// The live one is the latest run of the instant: a rerun
			// (k > 0) an earlier backfill left, whose run id is not the
			// instant's. Resumed under the instant's own id, which is
			// done, it was reported "done elsewhere" and left live for
			// good (an outside review killed a --rerun all backfill).
			it.Action = ActionResume
			it.RunID = claim.Run{Job: j.Name, At: at.Add(time.Duration(l.k))}.ID()
		case l.status == claim.Missed || rerun == RerunAll ||
			(rerun == RerunFailed && l.status == claim.Failed) ||
			(rerun == RerunSkipped && l.status == claim.Skipped):
			if l.k+1 >= maxReruns {
				return nil, fmt.Errorf("backfill: %s was rerun %d times; no rerun id left", it.RunID, l.k)
			}
			it.Action = ActionRerun
			it.RunID = claim.Run{Job: j.Name, At: at.Add(time.Duration(l.k + 1))}.ID()
		}
		plan = append(plan, it)
	}
	return plan, nil
}
