// This file owns the live runs nobody here dispatched: start-up recovery
// reads every job's recent history once, and the sweep reads it again, a
// slice of the jobs at a time, for as long as the replica runs; the
// processes that carry runs outside the schedule name them in the
// register, which every replica reads each tick. Each
// stands by, like a watcher, for a live run this replica neither executes
// nor watches, and takes it over once its holder is gone.

package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// recoverProbe is how many recent runs of each job recovery and the sweep
// read first. A run left live by a holder that died while no replica
// watched it is among its job's latest (nobody dispatched the instants
// after it), or behind the instants it held back while it lived, recorded
// skipped or missed: readLive reads on past those, eight times deeper at
// a time, up to maxOwnerProbe.
const recoverProbe = 16

// liveRead is one job's history read, limit records deep.
type liveRead struct {
	j     *jobState
	limit int
}

// firstReads are the first reads of jobs' histories.
func firstReads(jobs []*jobState) []liveRead {
	ps := make([]liveRead, len(jobs))
	for i, j := range jobs {
		ps[i] = liveRead{j: j, limit: recoverProbe}
	}
	return ps
}

// readLive reads the recent history of each of ps's jobs (at most maxBatch
// of them: claim.Histories, one round trip where the backend reads many
// jobs at once) and calls each with it, reading deeper where a live run
// could still hide past what was read (see recoverProbe). On an error it
// returns the reads not answered yet, for the caller to retry.
func (d *dispatcher) readLive(ctx context.Context, ps []liveRead, each func(*jobState, []claim.Record)) ([]liveRead, error) {
	for len(ps) > 0 {
		qs := make([]claim.HistoryQuery, len(ps))
		for i, p := range ps {
			qs[i] = claim.HistoryQuery{Job: p.j.Name, Limit: p.limit}
		}
		hctx, cancel := context.WithTimeout(ctx, d.r.opts.Lease)
		hists, err := claim.Histories(hctx, d.r.opts.Claimer, qs)
		cancel()
		if err != nil {
			return ps, err
		}
		var deeper []liveRead
		for i, p := range ps {
			if h := hists[i]; len(h) == p.limit && p.limit < maxOwnerProbe && !ranAndEnded(h[len(h)-1]) {
				// A run can stay live behind the instants skipped or
				// missed while it lived (a long run held them back while
				// nobody watched it): read deeper, as the overlap probe
				// does, or it is left to nobody.
				deeper = append(deeper, liveRead{j: p.j, limit: 8 * p.limit})
				continue
			}
			each(p.j, hists[i])
		}
		ps = deeper
	}
	return nil, nil
}

// recover finds, at start-up, the runs the backend still records as live
// (running or interrupted) and contends for each like a standby: their
// holder may have died while no replica stood by for them (a one-replica
// deployment, or every standby restarted since), and the look-back at the
// latest instant alone would leave an older one behind for good. A run
// still held is waited for; one handed back or expired is taken over,
// attempt+1, however old it is: a takeover is not a misfire. It retries a
// read until the backend answers or ctx (Run's) ends.
func (d *dispatcher) recover(ctx, execCtx context.Context, now time.Time) {
	r := d.r
	warned := false
	for jobs := r.jobs; len(jobs) > 0; {
		chunk := jobs[:min(len(jobs), maxBatch)]
		jobs = jobs[len(chunk):]
		ps := firstReads(chunk)
		for attempt := 0; ; attempt++ {
			var err error
			ps, err = d.readLive(ctx, ps, func(j *jobState, recs []claim.Record) {
				// The live runs first: each is watched (live here) before
				// any later instant is dispatched, so a later instant's
				// overlap check sees it and stands by for it, or takes it
				// over itself, instead of starting before its takeover is
				// granted and making the takeover yield (a run that
				// started, lost to a crash).
				for _, rec := range recs {
					if rec.Status.Live() && !rec.At.After(now) {
						d.start(ctx, execCtx, j, rec.At, origin{takeover: true}, 0)
					}
				}
				d.startupHistory(ctx, execCtx, j, recs, now)
				if j.Misfire != MisfireRunAll {
					// The look-back (Run): run-all catches it up in turn
					// with the instants before it (catchup.go).
					d.start(ctx, execCtx, j, r.lookBack(j, now), origin{late: MissedNoReplica}, r.opts.Spread)
				}
			})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			if !warned {
				r.log.WarnContext(ctx, "cannot list live runs to recover; retrying", "instance", r.opts.Instance,
					"claimer", r.opts.ClaimerName, "job", ps[0].j.Name, "jobs", len(ps), "error", err.Error())
				warned = true
			}
			if !sleep(ctx, jitter(min(r.opts.RenewEvery, time.Duration(1<<min(attempt, 6))*50*time.Millisecond))) {
				return
			}
		}
	}
	d.warnOrphansOfOtherJobs(ctx, now)
}

// orphanProbe is how many of the newest records of every job start-up
// looks through for the orphans of jobs this replica does not run.
const orphanProbe = 1000

// warnOrphansOfOtherJobs says, once at start-up, which jobs this replica
// does not run have live runs whose leases lapsed: a holder died (or was
// stopped) and its job was then removed from the configuration, or is
// disabled here. Nothing here takes them over; a replica whose
// configuration has the job does. Without this, such a run showed
// `running` in `scheduler runs` for as long as it took, with no word from
// any replica (an outside review). Best effort: the newest orphanProbe
// records of all jobs, one read, no retry.
func (d *dispatcher) warnOrphansOfOtherJobs(ctx context.Context, now time.Time) {
	r := d.r
	hctx, cancel := context.WithTimeout(ctx, r.opts.Lease)
	defer cancel()
	recs, err := r.opts.Claimer.History(hctx, "", orphanProbe)
	if err != nil {
		return
	}
	type orphans struct {
		count  int
		oldest claim.Record
	}
	byJob := map[string]*orphans{}
	var order []string
	for _, rec := range recs {
		if !rec.Status.Live() || rec.LeaseUntil.After(now) || r.job(rec.Job) != nil {
			continue
		}
		o := byJob[rec.Job]
		if o == nil {
			o = &orphans{}
			byJob[rec.Job] = o
			order = append(order, rec.Job)
		}
		o.count++
		o.oldest = rec // newest first: the last seen is the oldest
	}
	for _, job := range order {
		o := byJob[job]
		r.log.WarnContext(ctx, "live runs of a job this replica does not run, their leases lapsed; a replica that runs the job takes them over",
			"job", job, "instance", r.opts.Instance, "claimer", r.opts.ClaimerName, "count", o.count,
			"run_id", o.oldest.RunID, "holder", o.oldest.Holder)
	}
}

// sweep reads the jobs' recent histories again, maxBatch jobs per
// SweepEvery/chunks, so that every job is read once per SweepEvery, and
// stands by for each live run nobody here watches (adopt). Such a run had
// a holder no replica dispatched it with: a `trigger --here` or a
// backfill process, killed or stopped mid-run (its run handed back
// interrupted, or its lease left to lapse). Nothing else would take it
// over: the overlap probe of a forbid job's next instant adopts it, but
// only at that instant (tomorrow night, for a nightly job), and an allow
// job's never. A read that fails is not retried: the next pass reads
// those jobs again.
func (d *dispatcher) sweep(ctx, execCtx context.Context) {
	r := d.r
	if r.opts.SweepEvery < 0 || len(r.jobs) == 0 {
		return
	}
	chunks := (len(r.jobs) + maxBatch - 1) / maxBatch
	for next := 0; ; next = (next + 1) % chunks {
		if !sleep(ctx, jitter(r.opts.SweepEvery/time.Duration(chunks))) {
			return
		}
		// Runs falling due come first: a read of 1,000 jobs' histories
		// in the middle of thousands of claims would cost them lag
		// (measured: redis lag p99 at 10,000 × 3 up by a quarter). It
		// waits for a moment with no claim, release or probe in flight,
		// for up to SweepEvery.
		for quiet := time.Now().Add(r.opts.SweepEvery); d.busy() && time.Now().Before(quiet); {
			if !sleep(ctx, jitter(50*time.Millisecond)) {
				return
			}
		}
		chunk := r.jobs[next*maxBatch : min(len(r.jobs), (next+1)*maxBatch)]
		// A run whose instant the dispatch loop is still due to reach
		// (its hold, or a clock behind the others) is not yet watched
		// here, but no orphan: only instants past the late tolerance
		// count, by when the loop has dispatched them or given them up.
		before := r.opts.Now().Add(-r.lateTolerance())
		_, err := d.readLive(ctx, firstReads(chunk), func(j *jobState, recs []claim.Record) {
			var orphans []claim.Record
			for _, rec := range recs {
				if rec.Status.Live() && j.fire(rec.At).Before(before) {
					orphans = append(orphans, rec)
				}
			}
			d.adopt(ctx, execCtx, j, orphans, origin{takeover: true})
		})
		if err != nil && ctx.Err() == nil {
			r.log.DebugContext(ctx, "cannot read live runs to sweep", "instance", r.opts.Instance,
				"claimer", r.opts.ClaimerName, "job", chunk[0].Name, "jobs", len(chunk), "error", err.Error())
		}
	}
}

// busy reports whether this Run's claims, releases or overlap probes are
// in flight or waiting: runs are falling due.
func (d *dispatcher) busy() bool {
	return d.batch.q.active() || d.ends.q.active() || d.reads.q.active()
}

// carrier names one run a process outside the fleet (a backfill, a
// trigger) bids for and executes in the register (control.Carry), from
// before its first bid until it ends here, renewing the entry every
// RenewEvery. Every replica reads the entries every tick (unwatched),
// so a run this process leaves is taken over however deep its instant
// sits in its job's history; the sweep finds only those among their
// job's latest records.
//
// The entry goes in before the bid: a bid sent just before the process
// died may still be granted (the server had it), with nobody left to
// name the run. A replica leaves an entry whose grant is not confirmed
// to its process for as long as that bid could still be answered (see
// unwatched): a process alive by then carries its run on itself.
type carrier struct {
	d       *dispatcher
	ctx     context.Context
	ttl     time.Duration
	mu      sync.Mutex
	u       control.Unwatched
	stop    chan struct{}
	renewed chan struct{}
}

// carry starts naming run in the register as bid for here; nil if this
// Runner has no register. It returns an error, and the caller must not
// bid, if the entry could not be written: a bid without one, granted
// just before this process died, would leave the run live with nothing
// to lead the fleet to it (explorer seed 17074: the first write timed
// out on a slow link, the bid went anyway, and the backfill was killed
// 0.2s after its grant; the run stayed live for good).
func (d *dispatcher) carry(ctx context.Context, run claim.Run, alongside bool) (*carrier, error) {
	r := d.r
	if r.opts.Controls == nil {
		return nil, nil
	}
	c := &carrier{d: d, ctx: ctx, ttl: r.unwatchedTTL() + unwatchedOutage, stop: make(chan struct{}), renewed: make(chan struct{}),
		u: control.Unwatched{Job: run.Job, At: run.At, Holder: r.opts.Instance, Since: r.opts.Now(), Alongside: alongside}}
	// The bid waits for the first write: a process killed at once
	// leaves its entry, and the bid a server may still grant it. A write
	// that timed out may have landed; writing it again is harmless.
	for attempt := 1; ; attempt++ {
		err := c.put(min(r.opts.Lease, time.Duration(attempt)*r.opts.Lease/6))
		if err == nil {
			break
		}
		if attempt == 6 || ctx.Err() != nil || !sleep(ctx, jitter(min(r.opts.RenewEvery, time.Duration(attempt)*50*time.Millisecond))) {
			// A write that timed out may have landed: withdrawn, or the
			// fleet would take the run over as a bid's and run it, after
			// this caller heard that nothing ran.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.Lease/3)
			_ = r.opts.Controls.Ended(wctx, c.u, r.unwatchedTTL())
			cancel()
			return nil, fmt.Errorf("name %s in the register before bidding for it (nothing was bid for): %w", run.ID(), err)
		}
	}
	go func() {
		defer close(c.renewed)
		for {
			select {
			case <-c.stop:
				return
			case <-ctx.Done():
				return
			case <-time.After(jitter(r.opts.RenewEvery)):
			}
			c.put(r.opts.Lease / 3)
		}
	}()
	return c, nil
}

// put writes the entry as it stands, even once ctx ended: a run stopped
// as soon as it started is handed back, and its entry is what leads the
// fleet to it. A write that fails is tried again at the next renewal.
func (c *carrier) put(timeout time.Duration) error {
	c.mu.Lock()
	u := c.u
	c.mu.Unlock()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), timeout)
	defer cancel()
	return c.d.r.opts.Controls.Carry(wctx, u, c.ttl)
}

// granted says the run was granted here: replicas may stand by for it at
// once. Written before the run executes (the lease runs meanwhile, and
// its first renewal comes a RenewEvery after the execution starts: the
// write is tried three times, for a sixth of the lease each). It reports
// whether the write landed: until it has, the register names a bid only,
// and a replica that takes the run over goes by the job's overlap
// policy (noteAlongside), so a run meant to execute alongside must not
// start unmarked (runToEnd).
func (c *carrier) granted() bool {
	if c == nil {
		return true
	}
	c.mu.Lock()
	c.u.Granted = true
	c.mu.Unlock()
	var err error
	for range 3 {
		if err = c.put(c.d.r.opts.Lease / 6); err == nil {
			return true
		}
	}
	return false
}

// done stops the renewals. ended: the run ended here (or was found
// done), and its entry is withdrawn; otherwise (handed back, left to
// lapse, held by another, a bid whose answer was lost) it is left to
// expire, so that the replicas that read it stand by for the run.
func (c *carrier) done(ended bool) {
	if c == nil {
		return
	}
	close(c.stop)
	<-c.renewed
	if ended {
		c.mu.Lock()
		u := c.u
		c.mu.Unlock()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), c.d.r.opts.Lease/3)
		defer cancel()
		_ = c.d.r.opts.Controls.Ended(wctx, u, c.d.r.unwatchedTTL()) // else the entry expires, and a replica's standby hears done
	}
}

// unwatchedTTL is how long an entry of carry that says the run ended
// outlives its last renewal: past the run's lease, and past the late
// tolerance and a few ticks, by when every replica has read it and may
// stand by for its run (see unwatched).
func (r *Runner) unwatchedTTL() time.Duration {
	return 2*r.opts.Lease + r.lateTolerance() + 3*r.opts.ControlEvery
}

// unwatchedOutage is how much longer an entry of a run not ended there
// lives (its process killed or stopped mid-run): through an outage of the
// backend, after which the replica that takes the run over, perhaps one
// started during the outage, must still read that the run executes
// beside live runs, or it skips for good the instant a backfill started
// (explorer seed 9803: a 9s outage outlasted the entry). Such entries are
// few, one per run in flight in a process that left; an outage longer
// than this leaves the takeover to the job's policy.
const unwatchedOutage = 2 * time.Minute

// unwatched stands by (adopt) for each run the register names as carried
// by a process outside the schedule (carry) that this replica neither
// executes nor watches. While its holder lives, the standby hears done
// in the end; once it is gone, the run is taken over here. As with the
// sweep, an instant the dispatch loop may still reach is left to it until
// it is past the late tolerance: the entry outlives that (unwatchedTTL).
func (d *dispatcher) unwatched(ctx, execCtx context.Context, us []control.Unwatched) {
	r := d.r
	now := r.opts.Now()
	before := now.Add(-r.lateTolerance())
	d.forgetDone(time.Now().Add(-(r.unwatchedTTL() + unwatchedOutage)))
	for _, u := range us {
		j := r.job(u.Job)
		if u.Ends || j == nil || !j.fire(u.At).Before(before) || d.heard(u.Run()) {
			continue
		}
		// Alongside only if its process was granted the run: a bid alone
		// (held by the fleet, its answer lost) leaves the run the fleet's,
		// under its policy (see noteAlongside).
		if !u.Granted && now.Sub(u.Since) <= r.opts.Lease+2*r.opts.MaxClockSkew {
			// Its process may still be granted the bid it sent, and run
			// the run itself: a standby here would bid too, and might
			// win an instant the process was asked to run.
			continue
		}
		d.adopt(ctx, execCtx, j, []claim.Record{{RunID: u.Run().ID(), Job: u.Job, At: u.At, Status: claim.Running, Holder: u.Holder}},
			origin{takeover: true, alongside: u.Alongside && u.Granted, unwatched: true})
	}
}

// noteDone remembers that a standby for run's register entry heard it
// done: a done run is never granted again, so its entry, which lives on
// (unwatchedOutage), needs no standby any more.
func (d *dispatcher) noteDone(run claim.Run) {
	d.heardMu.Lock()
	defer d.heardMu.Unlock()
	if d.heardDone == nil {
		d.heardDone = map[string]time.Time{}
	}
	d.heardDone[run.ID()] = time.Now()
}

// heard reports whether a standby here heard run done (noteDone).
func (d *dispatcher) heard(run claim.Run) bool {
	d.heardMu.Lock()
	defer d.heardMu.Unlock()
	_, ok := d.heardDone[run.ID()]
	return ok
}

// forgetDone drops what noteDone noted before cut: by then the entries
// it was noted for have expired.
func (d *dispatcher) forgetDone(cut time.Time) {
	d.heardMu.Lock()
	defer d.heardMu.Unlock()
	for id, at := range d.heardDone {
		if at.Before(cut) {
			delete(d.heardDone, id)
		}
	}
}
