package compare

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/history"
)

// maxListed caps the example ids a cell lists (duplicates, missed runs,
// stale resources).
const maxListed = 20

// span is one execution on the timeline of the HTML report, in ms since the
// cell started.
type span struct {
	job, replica string
	from, to     float64
	status       string
	attempt      int
	dup, open    bool // open: never finished (crash or end of cell)
}

// analyze turns what the cell recorded into its report. Definitions
// (docs/compare.md has them for users):
//
//   - An execution is a grant whose handler started.
//   - It is a duplicate when it was granted while an earlier grant of the
//     same run was still valid: that grant's terminal release had been
//     accepted, or its lease, counted from the moment its last successful
//     Claim/Renew was sent, had not run out (less a small tolerance), and it
//     had not handed the run back. Takeovers after a lease ran out are not
//     duplicates.
//   - A run is missed when its instant lies in the steady window and no
//     execution's handler completed.
//
// The same record, as a history.Log, also goes through history.Check, the
// fault explorer's checker (and --faults random's); its violations land in
// Cell.Violations and fail the cell. Compare keeps its own counts beside
// them on purpose, as they answer other questions: a DUPS figure counts
// executions, where the checker reports broken invariants; a re-grant after
// an accepted success is a duplicate execution here, while the checker says
// succeeded-twice only when both report success (released-twice when both
// releases were accepted as terminal); and the duplicate rule above allows
// 5ms + lease/500 for backends that keep deadlines in whole milliseconds,
// where grant-overlap allows nothing. Takeovers, missed runs and the
// timeline's duplicate marks have no counterpart in the checker.
func (c *cell) analyze(res *Cell) {
	rec := c.rec
	rec.mu.Lock()
	defer rec.mu.Unlock()
	end := time.Now()
	res.DurationMS = ms(c.o.Duration)
	res.SteadyWindowMS = [2]float64{ms(c.plan.steady[0]), ms(c.plan.steady[1])}

	byRun := map[string][]*grant{}
	for _, g := range rec.grants {
		byRun[g.id] = append(byRun[g.id], g)
	}
	ids := make([]string, 0, len(byRun))
	for id, gs := range byRun {
		slices.SortFunc(gs, func(a, b *grant) int { return a.seq - b.seq })
		ids = append(ids, id)
	}
	sort.Strings(ids)
	// Lease deadlines are kept in whole milliseconds by some backends.
	tol := 5*time.Millisecond + c.lease/500
	var takeovers, lags []time.Duration
	for _, id := range ids {
		gs := byRun[id]
		for i, e := range gs {
			if e.started.IsZero() {
				continue
			}
			res.Executions++
			dup, prev := false, time.Time{}
			for _, g := range gs[:i] {
				if e.granted.Before(g.validUntil().Add(-tol)) {
					if !dup && len(res.DuplicateDetails) < maxListed {
						res.DuplicateDetails = append(res.DuplicateDetails, c.overlap(e, g))
					}
					dup = true
				}
				if g.confirmed.After(prev) {
					prev = g.confirmed
				}
			}
			switch {
			case dup:
				res.DuplicateExecutions++
				if !slices.Contains(res.DuplicateRuns, id) && len(res.DuplicateRuns) < maxListed {
					res.DuplicateRuns = append(res.DuplicateRuns, id)
				}
			case !prev.IsZero():
				res.Takeovers++
				takeovers = append(takeovers, e.started.Sub(prev))
			}
			if e.status == claim.LeaseLost {
				res.LeaseLost++
			}
			lag := e.started.Sub(e.run.At)
			lags = append(lags, lag)
			if lag < -c.o.MaxClockSkew {
				res.EarlyStarts++
			}
			res.spans = append(res.spans, c.span(e, dup, end))
		}
	}

	from, to := c.t0.Add(c.plan.steady[0]), c.t0.Add(c.plan.steady[1])
	if !c.cut.IsZero() {
		// Interrupted: judge only the runs that had their chance, by the
		// margin the window keeps before a cell's end (window).
		if last := c.cut.Add(-margin(c.o, c.work, c.plan.skewAbs)); last.Before(to) {
			to = last
		}
	}
	var expected []claim.Run
	for _, j := range c.work.jobs {
		for at := j.sched.Next(from); at.Before(to); at = j.sched.Next(at) {
			res.RunsExpected++
			run := claim.Run{Job: j.name, At: at}
			expected = append(expected, run)
			id := run.ID()
			if slices.ContainsFunc(byRun[id], func(g *grant) bool { return g.completed }) {
				res.RunsExecuted++
				continue
			}
			res.MissedRuns++
			if len(res.MissedRunIDs) < maxListed {
				res.MissedRunIDs = append(res.MissedRunIDs, id)
			}
		}
	}

	// Every job allows overlap: Spec.Forbid stays empty.
	for _, v := range history.Check(rec.log.Events(), history.Spec{Expected: expected}) {
		res.Violations = append(res.Violations, v.Format(c.t0))
	}

	st := c.store
	st.mu.Lock()
	res.FencedWrites, res.StaleWritesRejected, res.StaleWritesAccepted = st.writes, st.rejected, st.accepted
	res.StaleAcceptedResources = append(res.StaleAcceptedResources, st.staleIDs...)
	st.mu.Unlock()
	res.LeaseLostSeen = rec.leaseSeen
	res.DataLossTold = len(rec.lossUntil)

	res.ClaimLatency = dist(rec.claimLat)
	res.TakeoverTime = dist(takeovers)
	res.ScheduleLag = dist(lags)
	res.HarnessLag = dist(rec.lags)
	res.ClaimerCalls, res.RunsClaimed = rec.calls, len(rec.runs)
	if res.RunsClaimed > 0 {
		res.RoundTripsPerRun = float64(int(float64(rec.calls)/float64(res.RunsClaimed)*100+0.5)) / 100
	}
	res.claimLat = rec.claimLat
	res.FaultEvents = append(res.FaultEvents, rec.faults...)
	if c.faults.has(FaultSkew) || c.faults.has(FaultSkewBeyond) {
		res.ClockOffsetsMS = map[string]float64{}
		for _, rep := range c.reps {
			res.ClockOffsetsMS[rep.id] = ms(rep.offset)
		}
	}
	res.Status = StatusOK
	if res.failed() {
		res.Status = StatusFailed
	}
	res.Notes = c.notes(res)
}

// overlap describes a duplicate: e was granted while g was valid.
func (c *cell) overlap(e, g *grant) string {
	at := func(t time.Time) string { return fmt.Sprintf("+%.3fs", t.Sub(c.t0).Seconds()) }
	held := fmt.Sprintf("its lease, last confirmed %s for %v, ran to %s", at(g.confirmed), g.lease, at(g.confirmed.Add(g.lease)))
	switch {
	case g.outcome.Terminal():
		held = fmt.Sprintf("it had been released as %s at %s", g.outcome, at(g.released))
	case !g.released.IsZero():
		held += fmt.Sprintf(", handed back at %s", at(g.released))
	}
	return fmt.Sprintf("%s: %s granted (attempt %d, fence %d) at %s while %s held it (attempt %d, fence %d): %s",
		e.id, e.replica, e.attempt, e.fence, at(e.granted), g.replica, g.attempt, g.fence, held)
}

func (c *cell) span(g *grant, dup bool, end time.Time) span {
	s := span{job: g.run.Job, replica: g.replica, from: ms(g.started.Sub(c.t0)), status: string(g.status),
		attempt: g.attempt, dup: dup}
	switch {
	case !g.finished.IsZero():
		s.to = ms(g.finished.Sub(c.t0))
	case !c.rec.crashedAt[g.replica].IsZero():
		s.to, s.open = ms(c.rec.crashedAt[g.replica].Sub(c.t0)), true
	default:
		s.to, s.open = ms(end.Sub(c.t0)), true
	}
	return s
}

// notes explains a cell in a few sentences.
func (c *cell) notes(res *Cell) []string {
	notes := []string{}
	resets := 0
	var latency []string
	for _, f := range res.FaultEvents {
		at := time.Duration(f.AtMS * float64(time.Millisecond)).Round(100 * time.Millisecond)
		d := time.Duration(f.DurationMS * float64(time.Millisecond)).Round(10 * time.Millisecond)
		switch f.Kind {
		case FaultReset:
			resets++
		case FaultPause:
			notes = append(notes, fmt.Sprintf("pause: %s froze (handlers and keep-alive) for %v at +%v: %s", f.Replica, d, at, f.Note))
		case FaultCrash:
			notes = append(notes, fmt.Sprintf("crash: %s died at +%v without releasing: %s", f.Replica, at, f.Note))
		case FaultPartition:
			notes = append(notes, fmt.Sprintf("partition: %s cut off from its backend for %v at +%v: %s", f.Replica, d, at, f.Note))
		case FaultRedisRestart, FaultPostgresRestart:
			notes = append(notes, fmt.Sprintf("%s at +%v (%v down): %s", f.Kind, at, d, f.Note))
			if res.DataLossTold > 0 {
				notes = append(notes, fmt.Sprintf("the claimer noticed: %d of %d replicas were told the server lost its data, and held every run for a lease",
					res.DataLossTold, len(c.reps)))
			}
		case FaultLatency:
			latency = append(latency, f.Replica+" "+f.Note)
		}
	}
	if len(latency) > 0 {
		notes = append(notes, "latency each way, whole run: "+strings.Join(latency, ", "))
	}
	if resets > 0 {
		notes = append(notes, fmt.Sprintf("reset: %s, one replica at a time, every %v–%v", plural(resets, "connection reset"), c.lease/4, c.lease/2))
	}
	if len(res.ClockOffsetsMS) > 0 {
		var parts []string
		for _, rep := range c.reps {
			parts = append(parts, fmt.Sprintf("%s %+v", rep.id, rep.offset.Round(time.Millisecond)))
		}
		notes = append(notes, fmt.Sprintf("clock offsets (max_clock_skew %v): %s", c.o.MaxClockSkew, strings.Join(parts, ", ")))
	}
	if res.EarlyStarts > 0 {
		notes = append(notes, plural(res.EarlyStarts, "execution")+" started more than max_clock_skew before the instant (a replica clock ahead runs the schedule early)")
	}
	if res.StaleWritesRejected > 0 {
		notes = append(notes, fmt.Sprintf("fencing: %s rejected; %d of the rejected holders then saw their context cancelled with ErrLeaseLost",
			plural(res.StaleWritesRejected, "stale write"), res.LeaseLostSeen))
	}
	if res.StaleWritesAccepted > 0 {
		notes = append(notes, fmt.Sprintf("!!! FENCING FAILED: %s accepted after a newer holder had written (e.g. %s)",
			plural(res.StaleWritesAccepted, "stale write"), strings.Join(res.StaleAcceptedResources[:min(3, len(res.StaleAcceptedResources))], ", ")))
	}
	if res.DuplicateExecutions > 0 {
		notes = append(notes, fmt.Sprintf("%s: a run was granted while another holder's lease was valid (e.g. %s)",
			plural(res.DuplicateExecutions, "duplicate execution"), strings.Join(res.DuplicateRuns[:min(3, len(res.DuplicateRuns))], ", ")))
	}
	if n := len(res.Violations); n > 0 {
		var invs []string
		for _, v := range res.Violations {
			if inv, _, _ := strings.Cut(v, " "); !slices.Contains(invs, inv) {
				invs = append(invs, inv)
			}
		}
		notes = append(notes, fmt.Sprintf("history checker: %s (%s); the JSON report gives each with its trace",
			plural(n, "violation"), strings.Join(invs, ", ")))
	}
	if res.MissedRuns > 0 {
		notes = append(notes, fmt.Sprintf("%s in the steady window never completed (e.g. %s)",
			plural(res.MissedRuns, "run"), strings.Join(res.MissedRunIDs[:min(3, len(res.MissedRunIDs))], ", ")))
	}
	if res.HarnessLag.P99MS > float64(c.lease/10)/float64(time.Millisecond) {
		notes = append(notes, fmt.Sprintf("the harness was starved of CPU: its own timers fired up to %v late (p99 %v); these numbers say as much about this machine as about %s (try a lower --parallel)",
			msDur(res.HarnessLag.MaxMS).Round(time.Millisecond), msDur(res.HarnessLag.P99MS).Round(time.Millisecond), c.kind))
	}
	if res.RunsExpected == 0 {
		notes = append(notes, "the steady window held no instant: lengthen --duration")
	}
	return notes
}

// plural writes "1 run", "2 runs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// dist summarises durations: nearest-rank percentiles.
func dist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Dist{Count: len(s), P50MS: ms(rank(0.50)), P99MS: ms(rank(0.99)), MaxMS: ms(s[len(s)-1])}
}
