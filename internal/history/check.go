package history

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// Invariant names, as violations report them.
const (
	SucceededTwice  = "succeeded-twice"  // a run reported succeeded more than once
	GrantOverlap    = "grant-overlap"    // a run granted while its previous holder could still trust its lease
	RunOverlap      = "run-overlap"      // two handlers of one run executed at once
	FenceOrder      = "fence-order"      // a later grant of a job carried a fence no higher than an earlier one
	JobOverlap      = "job-overlap"      // two runs of an overlap-forbidden job executed at once
	Lost            = "lost"             // a run that fell due was neither executed nor recorded as skipped
	ReleasedTwice   = "released-twice"   // two grants of one run were both accepted as terminal
	Abandoned       = "abandoned"        // a run was granted, but never ended, though replicas stayed up
	TakeoverMisfire = "takeover-misfire" // a run that had started was skipped as a misfire on takeover
	HandedBackDone  = "handed-back-done" // a handler finished its work, and the run was handed back to run again
	Unscheduled     = "unscheduled"      // a scheduled run started at an instant no version of its job's schedule names
	RetryOverlap    = "retry-overlap"    // a retry of a run started before the attempt it retries had returned
	RetryEarly      = "retry-early"      // a retry of a run started before its job's backoff had passed since the attempt it retries returned
	AlongsideHeld   = "alongside-held"   // a run requested with overlap allow, or a backfill's, was skipped for overlap
	Overran         = "overran"          // a handler ran on past its lease: its holder did not stop it when it stopped trusting the lease
	Redone          = "redone"           // a run executed again after a handler of it returned nil inside its lease, with no fault to excuse it
	SkippedIdle     = "skipped-idle"     // a run of an overlap-forbidden job was skipped for overlap, though no other run of the job was live
)

// Spec is what a history is checked against.
type Spec struct {
	// Forbid holds the jobs whose runs must not overlap (overlap: forbid).
	Forbid map[string]bool
	// Expected lists the runs that fell due while some replica could
	// claim them: each must end in an accepted terminal release.
	Expected []claim.Run
	// Settled, when set, is the time by which every run granted before it
	// must have ended in a terminal release: replicas stayed up and healthy
	// long enough after it for any holder's lease to lapse and a standby,
	// or a restarted replica's recovery, to finish the run.
	Settled time.Time
	// Scheduled, when set, reports whether some version of a job's
	// schedule (replicas may run two during a rolling deploy) names a
	// run's instant. Every scheduled run started must be one: an instant
	// named by both versions then runs once under its one run id, and a
	// run id that drifted off its instant (jitter added to it, a zone
	// applied twice) is caught rather than run beside the real one.
	Scheduled func(claim.Run) bool
	// Backfills names the processes that ran backfills. A backfill
	// ignores the jobs' overlap policy by design (an operator's explicit
	// request for past instants), and a run it started is a backfilled
	// run wherever it goes on (a replica's takeover of it included): so
	// their executions, those of runs a backfill was granted first, and
	// those of a run from when a backfill started executing it, are left
	// out of job-overlap; and such a takeover skipped for overlap is
	// alongside-held (its instant would never run). Every other
	// invariant holds for them as for any run.
	Backfills map[string]bool
	// Alongside holds the runs an operator requested with overlap allow
	// (control.Request.Overlap): each may run beside the job's other
	// runs by design, so its executions are left out of job-overlap.
	Alongside map[string]bool
	// Backoff holds, for the jobs that retry failed attempts, the least
	// wait before a retry (their backoff; it doubles per attempt): no
	// retry may start sooner after the attempt it retries returned, less
	// Slack, the replicas' clocks' bound (the retry time is written on
	// one clock and read on another). Judged only where ClockOK, when
	// set, says both replicas' clocks kept within that bound meanwhile,
	// and where Recorded, when set, says the failed attempt's retry time
	// reached the register: an attempt whose holder was cut off from the
	// backend when it failed looks to the fleet like one that crashed,
	// and its run is taken over at once.
	Backoff  map[string]time.Duration
	Slack    time.Duration
	ClockOK  func(replica string, from, to time.Time) bool
	Recorded func(runID string, attempt int) bool
	// MustStop, when set, judges that handlers stop within their leases:
	// a holder stops trusting its lease before its last confirmed
	// request + lease, and cancels the handler then, so one still running
	// OverrunSlack past that overran. MustStop says whether job's handler
	// on replica must have stopped by from, given what happened to it
	// until to: not a handler that ignores its cancellation, nor one
	// frozen with its replica meanwhile. Every execution is cut at its
	// lease all the same for the overlap invariants: past it, only
	// fencing protects storage.
	MustStop     func(replica, job string, from, to time.Time) bool
	OverrunSlack time.Duration
	// Excused, when set, judges that a run whose handler returned nil
	// while its holder still trusted the lease is not executed again: the
	// holder's release is on its way, and lands before any standby may
	// take the run over (the lease, or the claimers' hold on takeovers
	// after a backend that left calls unanswered). Excused says whether a
	// fault could have kept it from doing so: done is the handler's
	// return, leaseEnd when its lease could end, again the first grant
	// of the run to another holder after it (an execution again may come
	// after that grant was handed back), crashed the holder's first crash
	// in between (zero: none): a crash soon after the return loses a
	// release not yet sent, while one sent into a stalled backend still
	// lands when it resumes. The billing run whose handler returned nil
	// must not bill again.
	Excused func(done, again Event, leaseEnd, crashed time.Time) bool
	// Forgotten, when set, reports whether the backend lost grant with
	// its data after it was made (a server gone back to an older copy):
	// from then, other runs of its job are granted and started as if it
	// had never been, until its holder learns so at a renewal or ends
	// it, by until. An execution started in that window beside the lost
	// grant's is no overlap, and a lost grant whose holder died with it
	// is no abandoned run: the grant is gone, as a restart's lost last
	// second takes one.
	Forgotten func(grant Event) (from, until time.Time, ok bool)
	// Unwritten, when set, reports whether the backend lost release, an
	// accepted terminal release, with its data since (the same server
	// gone back): a later grant's terminal release is then the run's
	// first the backend kept, not a second.
	Unwritten func(release Event) bool
	// OverlapSlack, when set, judges every skip for overlap that its
	// replica recorded in the backend, of a job in Forbid: another run of
	// the job was live at some time from the run's instant, less
	// OverlapSlack (the replicas' clocks' bound: a replica whose clock
	// runs ahead reaches an instant early), to the skip. A run is live
	// from a grant's request until the backend kept a terminal release
	// of it (a release Unwritten does not end it; nor does one let go),
	// and the grant's holder settled it (its end). A skip
	// with nothing live is a run lost: the runner found an overlap that
	// was not there (stop 61: a clock ahead, a release late, and an
	// instant skipped for a run that ended before it came), and the lost
	// invariant cannot see it, since the skip was an accepted terminal
	// release. Where ClockOK is set, only skips by a replica whose clock
	// kept within the bound meanwhile are judged.
	OverlapSlack time.Duration
}

// Violation is one broken invariant, with the events that show it.
type Violation struct {
	Invariant string
	Run       string
	Detail    string
	Trace     []Event
}

func (v Violation) String() string {
	return fmt.Sprintf("%s %s: %s", v.Invariant, v.Run, v.Detail)
}

// Format renders v with its trace, times relative to t0.
func (v Violation) Format(t0 time.Time) string {
	var b strings.Builder
	b.WriteString(v.String())
	for _, e := range v.Trace {
		fmt.Fprintf(&b, "\n    %9.3fs %s", e.At.Sub(t0).Seconds(), e)
	}
	return b.String()
}

// execution is one handler's run on one replica, cut where it could no
// longer trust its lease: past that, only fencing protects storage.
type execution struct {
	run         claim.Run
	token       string
	replica     string
	start, stop time.Time
}

// holding is one grant and what its holder did with it.
type holding struct {
	grant Event
	until time.Time // latest confirmed Sent+lease
	letGo time.Time // Sent of the first release, accepted or not
}

// Check judges events against spec and returns every violation found,
// ordered by invariant and run.
func Check(events []Event, spec Spec) []Violation {
	c := &checker{spec: spec, byRun: map[string][]Event{}, holds: map[string]*holding{}}
	c.index(events)
	c.grants()
	c.fences()
	c.executions(events)
	c.lost()
	c.settled()
	c.policy(events)
	c.idleSkips(events)
	c.unscheduled(events)
	c.retries(events)
	c.redone(events)
	c.successes() // after redone: its excuses cover their consequences
	slices.SortStableFunc(c.out, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.Invariant, b.Invariant), cmp.Compare(a.Run, b.Run))
	})
	return c.out
}

type checker struct {
	spec  Spec
	byRun map[string][]Event
	holds map[string]*holding // by token
	order []*holding          // in grant order (reply time)
	out   []Violation
	// rerun: the runs redone found executed again after a success, each
	// time with a fault to excuse it (spec.Excused)
	rerun map[string]bool
}

func (c *checker) add(inv, run, detail string) {
	c.out = append(c.out, Violation{Invariant: inv, Run: run, Detail: detail, Trace: trace(c.byRun[run])})
}

// trace keeps the last events of a run that tell its story.
func trace(evs []Event) []Event {
	const max = 16
	if len(evs) > max {
		return evs[len(evs)-max:]
	}
	return evs
}

// traceFrom keeps a run's events from the first at or after from.
func traceFrom(evs []Event, from time.Time) []Event {
	const max = 24
	i := slices.IndexFunc(evs, func(e Event) bool { return !e.At.Before(from) })
	if i < 0 {
		return nil
	}
	return evs[i:min(len(evs), i+max)]
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (c *checker) index(events []Event) {
	for _, e := range events {
		if e.Run.Job != "" {
			id := e.Run.ID()
			c.byRun[id] = append(c.byRun[id], e)
		}
		switch e.Kind {
		case Grant:
			if h := c.holds[e.Token]; h != nil {
				h.until = later(h.until, e.Until) // a retried request answered twice
				continue
			}
			h := &holding{grant: e, until: e.Until}
			c.holds[e.Token] = h
			c.order = append(c.order, h)
		case Renew:
			// A holder's renewals are sequential, so the last one
			// confirmed bounds its lease, even when it shortened it: a
			// failed attempt cuts its lease to the retry's backoff.
			if h := c.holds[e.Token]; h != nil {
				h.until = e.Until
			}
		case Release, LetGo:
			if h := c.holds[e.Token]; h != nil && (h.letGo.IsZero() || e.Sent.Before(h.letGo)) {
				h.letGo = e.Sent
			}
		case End:
			// An attempt that ended retrying has returned and let its
			// lease go (cut to the backoff, or left to lapse when the cut
			// got no answer): its holder trusts it no further, whatever
			// the backend still holds.
			if h := c.holds[e.Token]; h != nil && e.Status == claim.Retrying && e.At.Before(h.until) {
				h.until = e.At
			}
		}
	}
	slices.SortStableFunc(c.order, func(a, b *holding) int { return a.grant.At.Compare(b.grant.At) })
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// successes: one run, one success, whoever reports it. A run executed
// again after a success that spec.Excused excused (redone) reports its
// second success, and has its second terminal release accepted, as a
// consequence of that excuse (a holder gone with its memory of the
// release, a backend gone back in time past it): judged there, not
// here.
func (c *checker) successes() {
	for id, evs := range c.byRun {
		if c.rerun[id] {
			continue
		}
		var ended, released []string
		for _, e := range evs {
			if e.Kind == End && e.Status == claim.Succeeded {
				ended = append(ended, e.Replica)
			}
			if e.Kind == Release && e.Status.Terminal() && !slices.Contains(released, e.Token) &&
				(c.spec.Unwritten == nil || !c.spec.Unwritten(e)) {
				released = append(released, e.Token)
			}
		}
		if len(ended) > 1 {
			c.add(SucceededTwice, id, fmt.Sprintf("reported succeeded %d times (by %s)", len(ended), strings.Join(ended, ", ")))
		}
		if len(released) > 1 {
			c.add(ReleasedTwice, id, fmt.Sprintf("%d grants were each accepted as terminal", len(released)))
		}
	}
}

// grants: a run is granted anew only once its previous holder can no
// longer trust its lease (the backend cannot have ended that lease before
// Sent+lease of the holder's last confirmed request) or handed it back.
//
// Which of two grants came first is known from time when one's request
// left after the other's reply came back. When the two were in flight
// together it is the backend's order, which the fences give (fences checks
// them), not the order the replies arrived in: a reply can come back long
// after its grant (a loaded replica, a batch whose other runs were still
// contended), after the reply of a takeover that the grant's expiry
// allowed.
func (c *checker) grants() {
	byRun := map[string][]*holding{}
	for _, h := range c.order {
		id := h.grant.Run.ID()
		for _, other := range byRun[id] {
			prev, next := other, h
			if !h.grant.Sent.After(other.grant.At) && (other.grant.Sent.After(h.grant.At) || h.grant.Fence < other.grant.Fence) {
				prev, next = h, other
			}
			// A holder that sent a release had let the claim go, even if
			// the release was not confirmed: on redlock it can land on
			// some nodes, which then grant a takeover at once.
			handedBack := !prev.letGo.IsZero() && !prev.letGo.After(next.grant.At)
			if !handedBack && next.grant.At.Before(prev.until) {
				c.add(GrantOverlap, id, fmt.Sprintf("granted to %s (fence %d, attempt %d) %v before %s's lease (fence %d) could end",
					next.grant.Replica, next.grant.Fence, next.grant.Attempt, prev.until.Sub(next.grant.At).Round(time.Millisecond),
					prev.grant.Replica, prev.grant.Fence))
				// The story is the two grants and what came between.
				c.out[len(c.out)-1].Trace = traceFrom(c.byRun[id], minTime(prev.grant.At, next.grant.At))
			}
		}
		byRun[id] = append(byRun[id], h)
	}
}

// fences: a grant whose request left after another grant's reply came
// back carries a higher fence than it, for the same job.
func (c *checker) fences() {
	byJob := map[string][]*holding{}
	for _, h := range c.order {
		byJob[h.grant.Run.Job] = append(byJob[h.grant.Run.Job], h)
	}
	for _, hs := range byJob {
		bySent := slices.Clone(hs)
		slices.SortStableFunc(bySent, func(a, b *holding) int { return a.grant.Sent.Compare(b.grant.Sent) })
		var top *holding
		i := 0
		for _, h := range bySent {
			for ; i < len(hs) && hs[i].grant.At.Before(h.grant.Sent); i++ {
				if top == nil || hs[i].grant.Fence > top.grant.Fence {
					top = hs[i]
				}
			}
			if top != nil && h.grant.Fence <= top.grant.Fence {
				c.add(FenceOrder, h.grant.Run.ID(), fmt.Sprintf("fence %d granted to %s after fence %d (%s, %s) was already granted",
					h.grant.Fence, h.grant.Replica, top.grant.Fence, top.grant.Replica, top.grant.Run.ID()))
			}
		}
	}
}

// executions pairs starts with ends, cuts each at its lease's trust and
// at its replica's crash, then looks for overlaps within a run and, where
// overlap is forbidden, within a job.
func (c *checker) executions(events []Event) {
	var end time.Time
	if len(events) > 0 {
		end = events[len(events)-1].At
	}
	open := map[string]*execution{} // by token
	var done []*execution
	for _, e := range events {
		switch e.Kind {
		case Start:
			open[e.Token] = &execution{run: e.Run, token: e.Token, replica: e.Replica, start: e.At}
		case Return, End:
			if x := open[e.Token]; x != nil {
				x.stop = e.At
				if e.Ran > 0 && x.start.Add(e.Ran).Before(x.stop) {
					x.stop = x.start.Add(e.Ran)
				}
				done = append(done, x)
				delete(open, e.Token)
			}
		case Crash:
			for tok, x := range open {
				if x.replica == e.Replica {
					x.stop = e.At
					done = append(done, x)
					delete(open, tok)
				}
			}
		}
	}
	for _, x := range open {
		x.stop = end
		done = append(done, x)
	}
	for _, x := range done {
		if h := c.holds[x.token]; h != nil && h.until.Before(x.stop) {
			if over := x.stop.Sub(h.until); over > c.spec.OverrunSlack && c.spec.MustStop != nil && c.spec.MustStop(x.replica, x.run.Job, h.until, x.stop) {
				c.add(Overran, x.run.ID(), fmt.Sprintf("the handler on %s (fence %d) ran %v past its lease, which ended at its last confirmed request + lease",
					x.replica, h.grant.Fence, over.Round(time.Millisecond)))
			}
			x.stop = h.until
		}
	}
	// An execution that began only after its lease could have ended (its
	// replica paused between grant and start) never ran trusted.
	done = slices.DeleteFunc(done, func(x *execution) bool { return !x.stop.After(x.start) })
	slices.SortFunc(done, func(a, b *execution) int { return a.start.Compare(b.start) })
	c.overlaps(done, func(x *execution) string { return x.run.ID() }, RunOverlap)
	backfilled, resumed := c.backfilled(), backfillStarts(events, c.spec)
	var forbidden []*execution
	for _, x := range done {
		since, ok := resumed[x.run.ID()]
		afterBackfill := ok && !x.start.Before(since)
		if c.spec.Forbid[x.run.Job] && !c.spec.Backfills[x.replica] && !backfilled[x.run.ID()] && !afterBackfill && !c.spec.Alongside[x.run.ID()] {
			forbidden = append(forbidden, x)
		}
	}
	c.overlaps(forbidden, func(x *execution) string { return x.run.Job }, JobOverlap)
}

// backfilled reports, by run id, whether a backfill was granted the run
// first: it then runs beside the job's other runs wherever it goes on.
func (c *checker) backfilled() map[string]bool {
	first := map[string]bool{}
	for _, h := range c.order {
		id := h.grant.Run.ID()
		if _, seen := first[id]; !seen {
			first[id] = c.spec.Backfills[h.grant.Replica]
		}
	}
	return first
}

// backfillStarts reports, by run id, when a backfill first started
// executing the run: from then on it runs beside the job's other runs,
// and so do the takeovers of it that follow (a backfill that took over
// a run the fleet had been granted first resumes it so).
func backfillStarts(events []Event, spec Spec) map[string]time.Time {
	first := map[string]time.Time{}
	for _, e := range events {
		if e.Kind == Start && spec.Backfills[e.Replica] {
			if t, ok := first[e.Run.ID()]; !ok || e.At.Before(t) {
				first[e.Run.ID()] = e.At
			}
		}
	}
	return first
}

// overlaps reports executions, sorted by start, that overlap another of the
// same group (key) but of a different grant (same run) or run (same job).
func (c *checker) overlaps(xs []*execution, key func(*execution) string, inv string) {
	last := map[string]*execution{} // the execution of each group that ends last so far
	for _, x := range xs {
		k := key(x)
		p := last[k]
		if p != nil && x.start.Before(p.stop) && p.token != x.token && (inv == RunOverlap || p.run != x.run) && !c.forgotten(p, x) {
			c.add(inv, x.run.ID(), fmt.Sprintf("%s (%s) started %v before %s (%s, %s) stopped",
				x.replica, x.token[:min(6, len(x.token))], p.stop.Sub(x.start).Round(time.Millisecond),
				p.replica, p.token[:min(6, len(p.token))], p.run.ID()))
			if inv == JobOverlap { // both runs' stories, the last of each
				half := func(evs []Event) []Event { return evs[max(0, len(evs)-10):] }
				c.out[len(c.out)-1].Trace = append(slices.Clone(half(c.byRun[p.run.ID()])), half(c.byRun[x.run.ID()])...)
			}
		}
		if p == nil || x.stop.After(p.stop) {
			last[k] = x
		}
	}
}

// forgotten reports whether x started beside p only because the backend
// had lost p's grant (spec.Forgotten), and p stopped within the window
// its holder had to learn so.
func (c *checker) forgotten(p, x *execution) bool {
	h := c.holds[p.token]
	if c.spec.Forgotten == nil || h == nil {
		return false
	}
	from, until, ok := c.spec.Forgotten(h.grant)
	return ok && !x.start.Before(from) && !p.stop.After(until)
}

// lost: every expected run ends in an accepted terminal release (executed,
// failed, or skipped by a recorded policy decision).
func (c *checker) lost() {
	for _, run := range c.spec.Expected {
		id := run.ID()
		if !c.ended(id) {
			c.add(Lost, id, "fell due while a replica could claim it, but no terminal release was accepted")
		}
	}
}

// settled: a run granted before spec.Settled ends in a terminal release.
func (c *checker) settled() {
	if c.spec.Settled.IsZero() {
		return
	}
	seen := map[string]bool{}
	for _, h := range c.order {
		id := h.grant.Run.ID()
		if seen[id] || !h.grant.At.Before(c.spec.Settled) {
			continue
		}
		seen[id] = true
		if c.spec.Forgotten != nil {
			if _, _, lost := c.spec.Forgotten(h.grant); lost {
				continue
			}
		}
		if !c.ended(id) {
			c.add(Abandoned, id, "granted, but no terminal release was accepted by the end, though replicas stayed up")
		}
	}
}

// policy: a run's policy is applied to what happened to it. A takeover
// (attempt > 1) is of a run that started on time: the misfire policy is
// for runs that never started. And a handler that returned nil did the
// work: handing its run back (interrupted) would have it done again.
func (c *checker) policy(events []Event) {
	completed := map[string]bool{} // tokens whose handler returned nil
	// Runs a backfill started executing: their takeovers run beside live
	// runs as the backfill did, until the run's work is done once. (A
	// backfill's grant whose answer it never had is the fleet's, under
	// the job's policy; so is a takeover the register could not tell of,
	// of a run whose handler had finished: the work was done.)
	backfilled := backfillStarts(events, c.spec)
	ran := map[string]bool{} // runs a handler of which returned nil
	for _, e := range events {
		if e.Kind == Return && e.Status == claim.Succeeded {
			ran[e.Run.ID()] = true
		}
		switch {
		case e.Kind == Skip && e.Reason == "missed" && e.Attempt > 1:
			c.add(TakeoverMisfire, e.Run.ID(), fmt.Sprintf("%s skipped attempt %d as a misfire", e.Replica, e.Attempt))
		case e.Kind == Skip && e.Reason == "overlap" && e.Token != "" && c.spec.Alongside[e.Run.ID()]:
			c.add(AlongsideHeld, e.Run.ID(), fmt.Sprintf("%s skipped a run requested with overlap allow, for overlap", e.Replica))
		case e.Kind == Skip && e.Reason == "overlap" && e.Token != "" && !backfilled[e.Run.ID()].IsZero() && e.At.After(backfilled[e.Run.ID()]) && !ran[e.Run.ID()]:
			c.add(AlongsideHeld, e.Run.ID(), fmt.Sprintf("%s skipped attempt %d of a backfill's run, for overlap", e.Replica, e.Attempt))
		case e.Kind == Return && e.Status == claim.Succeeded:
			completed[e.Token] = true
		case (e.Kind == Release || e.Kind == LetGo) && e.Status == claim.Interrupted && completed[e.Token]:
			c.add(HandedBackDone, e.Run.ID(), fmt.Sprintf("%s's handler returned nil, then the run was released as interrupted", e.Replica))
		}
	}
}

// idleSkips: a run skipped for overlap had another run of its job live
// at some time from its instant, less spec.OverlapSlack, to the skip.
// A grant is live from its request until its holder settled it (its end)
// and the backend kept a terminal release of the run: a holder whose
// reply was lost, or whose stale handler returned into an outage, still
// counts its run as executing there, as the runner does; a holder that
// died with it leaves it live until a terminal release is kept. A claim
// call left unanswered may have granted too, unseen (its replica's next
// try is then given that grant, claim.Bids, or hears "held" until its
// lease lapses): its run counts as live from the request to a lease after
// the reply (the long exploration's redis-cluster seed 96000017: a
// replica skipped a run for overlap with a requested run whose holder's
// first try had been granted unseen; its second try, which took that
// grant over, was logged only after the skip).
func (c *checker) idleSkips(events []Event) {
	if c.spec.OverlapSlack <= 0 {
		return
	}
	type grant struct {
		id, token string
		from      time.Time
		until     time.Time // an unanswered call's: the latest its grant could last; zero for a grant
	}
	byJob := map[string][]grant{}
	endedAt := map[string]time.Time{} // a holder's end, by token (not c.ended: that asks of a run)
	kept := map[string][]time.Time{}  // the kept terminal releases, by run id
	for _, e := range events {
		switch {
		case e.Kind == Grant:
			byJob[e.Run.Job] = append(byJob[e.Run.Job], grant{id: e.Run.ID(), token: e.Token, from: e.Sent})
		case e.Kind == Unanswered:
			byJob[e.Run.Job] = append(byJob[e.Run.Job], grant{id: e.Run.ID(), from: e.Sent, until: e.Until})
		case e.Kind == End:
			if _, ok := endedAt[e.Token]; !ok {
				endedAt[e.Token] = e.At
			}
		case e.Kind == Release && e.Status.Terminal() && (c.spec.Unwritten == nil || !c.spec.Unwritten(e)):
			kept[e.Run.ID()] = append(kept[e.Run.ID()], e.At)
		}
	}
	liveFrom := func(g grant, from, to time.Time) bool {
		if g.from.After(to) {
			return false
		}
		if !g.until.IsZero() {
			return !g.until.Before(from)
		}
		i := slices.IndexFunc(kept[g.id], func(at time.Time) bool { return !at.Before(g.from) })
		if i < 0 {
			return true // no end kept: live to the end of the history
		}
		end := kept[g.id][i]
		if at, ok := endedAt[g.token]; ok && at.After(end) {
			end = at
		}
		return !end.Before(from)
	}
	for _, e := range events {
		if e.Kind != Skip || e.Reason != "overlap" || e.Token == "" || !c.spec.Forbid[e.Run.Job] {
			continue
		}
		from, id := e.Run.At.Add(-c.spec.OverlapSlack), e.Run.ID()
		if c.spec.ClockOK != nil && !c.spec.ClockOK(e.Replica, from.Add(-c.spec.OverlapSlack), e.At) {
			continue // a clock beyond the bound: the replica reached the instant as early as it ran ahead
		}
		busy := slices.ContainsFunc(byJob[e.Run.Job], func(g grant) bool { return g.id != id && liveFrom(g, from, e.At) })
		if !busy {
			c.add(SkippedIdle, id, fmt.Sprintf("%s skipped attempt %d for overlap, though no other run of %s was live from %v before its instant on",
				e.Replica, e.Attempt, e.Run.Job, c.spec.OverlapSlack))
		}
	}
}

// ended reports whether a run reached a terminal state: a terminal release
// was accepted, or its holder decided its end (the handler finished it, or
// the holder skipped it or failed it for good) and the backend then told a
// replica the run was done: a release that landed but whose reply was
// lost, or that landed on a quorum across several tries, none of which
// alone was confirmed (redlock; a crash can cut the tries short).
func (c *checker) ended(id string) bool {
	evs := c.byRun[id]
	if slices.ContainsFunc(evs, func(e Event) bool { return e.Kind == Release && e.Status.Terminal() }) {
		return true
	}
	decided := slices.ContainsFunc(evs, func(e Event) bool {
		return (e.Kind == Return && e.Status == claim.Succeeded) || (e.Kind == Skip && e.Token != "") ||
			(e.Kind == End && e.Status.Terminal())
	})
	return decided && slices.ContainsFunc(evs, func(e Event) bool { return e.Kind == Skip && e.Reason == "done" })
}

// retries: an attempt that failed and handed its run on to a retry
// (status retrying) had returned before any later attempt of the run
// started, and the job's backoff had passed since (spec.Backoff). The
// lease cut already keeps grants apart (grants); this checks the
// handlers themselves.
func (c *checker) retries(events []Event) {
	returned := map[string]time.Time{}  // by token
	retrying := map[string][]*holding{} // by run id
	for _, e := range events {
		switch {
		case e.Kind == Return:
			returned[e.Token] = e.At
		case e.Kind == End && e.Status == claim.Retrying:
			if h := c.holds[e.Token]; h != nil {
				retrying[e.Run.ID()] = append(retrying[e.Run.ID()], h)
			}
		}
	}
	for _, e := range events {
		if e.Kind != Start {
			continue
		}
		x := c.holds[e.Token]
		for _, prev := range retrying[e.Run.ID()] {
			// An attempt granted after this start is not one it retries,
			// whatever its number: a backend that lost the run's record
			// grants it again from attempt 1 (the rerun is redone's to
			// judge).
			if x == nil || prev.grant.Attempt >= x.grant.Attempt || !prev.grant.At.Before(e.At) {
				continue
			}
			ret, ok := returned[prev.grant.Token]
			if !ok || e.At.Before(ret) {
				c.add(RetryOverlap, e.Run.ID(), fmt.Sprintf("attempt %d started on %s before attempt %d (%s) had returned",
					x.grant.Attempt, e.Replica, prev.grant.Attempt, prev.grant.Replica))
				continue
			}
			b := c.spec.Backoff[e.Run.Job]
			judged := (c.spec.ClockOK == nil || c.spec.ClockOK(prev.grant.Replica, ret, e.At) && c.spec.ClockOK(e.Replica, ret, e.At)) &&
				(c.spec.Recorded == nil || c.spec.Recorded(e.Run.ID(), prev.grant.Attempt))
			if gap := e.At.Sub(ret); b > 0 && gap < b-c.spec.Slack && judged {
				c.add(RetryEarly, e.Run.ID(), fmt.Sprintf("attempt %d started on %s %v after attempt %d (%s) returned, before the backoff of %v (less %v of clock skew)",
					x.grant.Attempt, e.Replica, gap.Round(time.Millisecond), prev.grant.Attempt, prev.grant.Replica, b, c.spec.Slack))
			}
		}
	}
}

// redone: a run whose handler returned nil inside its lease executes
// again only when spec.Excused finds a fault that could have kept the
// holder's release from landing (a crash of the holder among them).
func (c *checker) redone(events []Event) {
	if c.spec.Excused == nil {
		return
	}
	type done struct {
		ret   Event
		until time.Time
		taken *Event // the first grant to another holder after ret
	}
	last := map[string]done{} // by run id: the latest return of nil inside its lease
	crashed := map[string][]time.Time{}
	for _, e := range events {
		if e.Kind == Crash {
			crashed[e.Replica] = append(crashed[e.Replica], e.At)
		}
	}
	for _, e := range events {
		id := e.Run.ID()
		switch e.Kind {
		case Return:
			if h := c.holds[e.Token]; e.Status == claim.Succeeded && h != nil && e.At.Before(h.until) {
				last[id] = done{ret: e, until: h.until}
			}
		case Grant:
			if d, ok := last[id]; ok && d.taken == nil && e.Token != d.ret.Token {
				d.taken = &e
				last[id] = d
			}
		case Start:
			d, ok := last[id]
			if !ok || e.Token == d.ret.Token {
				continue
			}
			if h := c.holds[e.Token]; h == nil || !e.At.Before(h.until) {
				continue // a stale holder's start, past its lease: fencing's to stop (executions)
			}
			r := d.ret
			var crash time.Time // the holder's first crash in between
			if i := slices.IndexFunc(crashed[r.Replica], func(t time.Time) bool { return !t.Before(r.At) && !t.After(e.At) }); i >= 0 {
				crash = crashed[r.Replica][i]
			}
			// The takeover that let the run go again is the one judged:
			// an execution can come after a hand-back of it.
			taken := e
			if d.taken != nil {
				taken = *d.taken
			}
			if c.spec.Excused(r, taken, d.until, crash) {
				if c.rerun == nil {
					c.rerun = map[string]bool{}
				}
				c.rerun[id] = true
				continue
			}
			c.add(Redone, id, fmt.Sprintf("executed again on %s (attempt %d) %v after its handler on %s (%s) returned nil inside its lease",
				e.Replica, e.Attempt, e.At.Sub(r.At).Round(time.Millisecond), r.Replica, r.Token[:min(6, len(r.Token))]))
			c.out[len(c.out)-1].Trace = traceFrom(c.byRun[id], r.At.Add(-time.Second))
		}
	}
}

// unscheduled: every scheduled (not manual) run that started is at an
// instant spec.Scheduled names.
func (c *checker) unscheduled(events []Event) {
	if c.spec.Scheduled == nil {
		return
	}
	seen := map[string]bool{}
	for _, e := range events {
		id := e.Run.ID()
		if e.Kind != Start || control.Manual(e.Run) || seen[id] {
			continue
		}
		seen[id] = true
		if !c.spec.Scheduled(e.Run) {
			c.add(Unscheduled, id, fmt.Sprintf("started on %s, but no version of %s's schedule names %s",
				e.Replica, e.Run.Job, e.Run.At.UTC().Format(time.RFC3339Nano)))
		}
	}
}
