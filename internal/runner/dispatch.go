// This file owns the life of a run up to its grant: dispatch and the
// start-up recovery, the overlap check before a bid, the hold (spread),
// claiming and standing by (contend), and what a won claim becomes
// (granted, tooLate), plus the per-job record of live runs those read.

package runner

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// dispatcher carries what one Run call's goroutines share. It holds no
// context: each goroutine gets the contexts that bound it as parameters
// (see the package doc).
type dispatcher struct {
	r       *Runner
	standby *sync.WaitGroup
	exec    *sync.WaitGroup
	// batch sends every claim call, ends every release, coalesced into
	// batches.
	batch *batcher
	ends  *releaser
	// reads sends the overlap probes' history reads, coalesced into
	// batches.
	reads *reader
	// spread is the hold window of the runs being dispatched; only Run's
	// loop reads and writes it.
	spread time.Duration
	// drift is the schedule-drift guard while the controls watcher runs
	// (drift.go): granted() reports the versions it runs to it.
	drift atomic.Pointer[drift]
	// adopts: the overlap probe stands by for the live runs it finds
	// that nobody here watches (adopt). Run's dispatcher only: a
	// trigger's or a backfill's process must not take the fleet's runs.
	adopts bool
	// standbyMu guards standbyClosed: set once Run's shutdown waits for
	// the standby group (see goStandby).
	standbyMu     sync.Mutex
	standbyClosed bool
	// unconfirmed counts the releases given up at a shutdown, the
	// backend silent for a lease: Run then says so, for its process to
	// exit 1.
	unconfirmed atomic.Int64
	// heardDone holds the runs a standby for a register entry (unwatched)
	// found done, and when: their entries live on for minutes, and
	// without it every tick stood by for each again, claimed it, heard
	// done and forgot it (an outside review: a database's transactions
	// ×12 and a fence burnt per claim, for two minutes, after two
	// backfills' lost bids). Guarded by heardMu.
	heardMu   sync.Mutex
	heardDone map[string]time.Time
}

// goStandby runs f on the standby group. Executions call it too (an
// overlap probe that adopts a live run, a run handed back and contended
// for again), and Run's shutdown waits for the standby group while they
// still run, within the grace: a goroutine added to that group then,
// from outside it, would race the wait (found by the race detector in
// the real-backend nemesis) and could outlive Run. So once the shutdown
// waits, f runs on the execution group, which the shutdown waits for
// next: its callers are executions (counted there) or standbys still
// counted in the group the shutdown waits for first.
func (d *dispatcher) goStandby(f func()) {
	d.standbyMu.Lock()
	defer d.standbyMu.Unlock()
	if d.standbyClosed {
		d.exec.Go(f)
		return
	}
	d.standby.Go(f)
}

// closeStandby sends every later goStandby to the execution group; Run
// calls it before it waits for the standby group.
func (d *dispatcher) closeStandby() {
	d.standbyMu.Lock()
	defer d.standbyMu.Unlock()
	d.standbyClosed = true
}

// dispatcher returns the state one Run (or Trigger) call's goroutines
// share.
func (r *Runner) dispatcher(standby, exec *sync.WaitGroup) *dispatcher {
	d := &dispatcher{r: r, standby: standby, exec: exec, spread: r.opts.Spread}
	d.batch = &batcher{d: d, q: queue[*bid]{run: func(x *bid) claim.Run { return x.run }}}
	d.ends = &releaser{d: d, q: queue[*ending]{run: func(x *ending) claim.Run { return x.cl.Run }}}
	d.reads = &reader{d: d}
	return d
}

// origin says why a run is dispatched, which decides what may stop it.
type origin struct {
	// late is why the instant may already be past its deadline
	// (MissedNoReplica at start-up, MissedBehind for a loop that woke
	// late); "" for an instant dispatched on time.
	late string
	// takeover marks a live run found at start-up: it started on time
	// and is taken over, never paused nor missed.
	takeover bool
	// request is the operator's request that asked for a manual run: it
	// is never paused nor missed, and its overlap is its own.
	request *control.Request
	// after delays the first bid: a retry is not due before its backoff
	// has passed, and is bid for promptly once it has.
	after time.Duration
	// catchup marks a run caught up after an outage (misfire: run-all):
	// it runs in its turn, after the earlier ones.
	catchup bool
	// alongside marks a run its first holder executed beside live runs
	// of its job (control.Unwatched.Alongside): so does its takeover.
	alongside bool
	// unwatched marks a standby for a run the register names as carried
	// by a process outside the schedule (see unwatched): heard done, it
	// is not stood by for again.
	unwatched bool
}

// admission is how the run's execution treats an earlier live run.
func (o origin) admission() admission {
	switch {
	case o.alongside, o.request != nil && o.request.Overlap == OverlapAllow:
		return admitAlways
	case o.catchup:
		return admitInTurn
	}
	return admitByPolicy
}

// dispatch starts the life of one run: claim, stand by, execute. Only
// Run's loop calls it (it reads the loop's spread). ctx is Run's: it
// bounds the standby; execCtx bounds the execution, if the run is won.
func (d *dispatcher) dispatch(ctx, execCtx context.Context, j *jobState, at time.Time, late string) {
	d.start(ctx, execCtx, j, at, origin{late: late}, d.spread)
}

func (d *dispatcher) start(ctx, execCtx context.Context, j *jobState, at time.Time, o origin, spread time.Duration) {
	if at.IsZero() {
		return
	}
	if d.r.opts.Now().Sub(j.fire(at)) <= d.r.lateTolerance() {
		o.late = "" // not late after all
	}
	run := claim.Run{Job: j.Name, At: at.UTC()}
	j.watch(at, o)
	d.goStandby(func() {
		defer j.setLive(at, watching, -1)
		if o.request == nil {
			// A request's run taken over (start-up recovery, adopt) is
			// still the request's: its overlap is its own.
			o.request = d.r.requestOf(ctx, run)
		}
		o.alongside = o.alongside || d.r.isAlongside(run)
		scheduled := !o.takeover && o.request == nil
		if scheduled && d.r.paused(ctx, j.Name) {
			// Recorded once, like an overlap: whichever replica wins the
			// run ends it as skipped/paused; the others hear done.
			d.contend(ctx, execCtx, j, run, o, ReasonPaused)
			return
		}
		// Forbid and buffer-one skip an instant here that a live run
		// keeps from starting (buffer-one only once one already waits);
		// replace never skips: it revokes (execute, overlap.go).
		forbid := (j.Overlap == OverlapForbid || j.Overlap == OverlapBufferOne) && o.admission() == admitByPolicy
		// An instant past its deadline that its misfire policy will not
		// run is recorded missed, whatever else is live: another
		// replica's claims on the outage's earlier instants, taken only to
		// record them missed, are no overlap. (A takeover of it, attempt
		// 2, would run it; execute's owner probe still guards that.)
		missed := o.late != "" && !j.runsLate(at, d.r.opts.Now())
		if forbid && !missed && (j.Overlap == OverlapForbid && d.overlaps(ctx, execCtx, j, at) ||
			j.Overlap == OverlapBufferOne && d.bufferFull(ctx, execCtx, j, at)) {
			// Record the skip in the backend, once: whichever replica wins
			// the run ends it as skipped; the others hear done. A holder
			// may be a ghost (a grant whose reply was lost) or die: stand
			// by for it as for any run.
			d.contend(ctx, execCtx, j, run, o, ReasonOverlap)
			return
		}
		if o.late == "" && !d.hold(ctx, j, run, spread) {
			return
		}
		d.contend(ctx, execCtx, j, run, o, "")
	})
}

// together reports whether j's run at, dispatched on time, may take its
// first bid from bidTogether: nothing is to be decided about it before
// its hold. A paused job (or pauses not read yet), an earlier run of a
// forbid job live or watched here, and buffer-one take start's path,
// which decides those, some by reading the backend.
func (d *dispatcher) together(j *jobState, at time.Time) bool {
	if d.r.opts.Controls != nil {
		if ps := d.r.pauses.Load(); ps == nil || ps.Paused(j.Name) {
			return false
		}
	}
	switch j.Overlap {
	case OverlapAllow, OverlapReplace:
		return true
	case OverlapForbid:
		n, watched := j.earlierLive(at)
		return n == 0 && len(watched) == 0
	}
	return false
}

// firstBid is a run dispatched on time whose first bid bidTogether sends
// once its hold has passed (holdEnd, on Options.Now's clock).
type firstBid struct {
	j       *jobState
	run     claim.Run
	holdEnd time.Time
}

// bidTogether sends the first bids for runs dispatched on time together
// (see together), each once its hold has passed, from one goroutine of
// the standby group, and acts on their answers. A run gets a goroutine of
// its own only once it is won or must stand by: thousands due at one
// instant cost none each while they are held and bid for, and those
// another replica won and finished none at all. The caller has made each
// run live (watching), as start does; the run stops being so once its
// contention is over, here or in the goroutine it was handed to. ctx is
// Run's: once it is done, runs not bid for yet are given up, as start's
// hold gives them up, and bids not answered yet are abandoned.
func (d *dispatcher) bidTogether(ctx, execCtx context.Context, runs []*firstBid) {
	slices.SortStableFunc(runs, func(a, b *firstBid) int { return a.holdEnd.Compare(b.holdEnd) })
	d.goStandby(func() {
		answers := make(chan *bid, len(runs))
		waiting := map[*bid]*firstBid{}
		hold := time.NewTimer(time.Hour)
		defer hold.Stop()
		done := ctx.Done()
		next := 0
		for next < len(runs) || len(waiting) > 0 {
			for ; next < len(runs) && done != nil; next++ {
				f := runs[next]
				wait := f.holdEnd.Sub(d.r.opts.Now())
				if wait > 0 {
					hold.Reset(wait)
					break
				}
				waiting[d.batch.bidFor(ctx, f.run, answers)] = f
			}
			var held <-chan time.Time
			if next < len(runs) && done != nil {
				held = hold.C
			}
			select {
			case x := <-answers:
				f := waiting[x]
				delete(waiting, x)
				d.firstAnswer(ctx, execCtx, f, x.cl, x.err)
			case <-held:
			case <-done:
				done = nil
				for _, f := range runs[next:] {
					f.j.setLive(f.run.At, watching, -1)
				}
				next = len(runs)
				for x, f := range waiting {
					if x.state.CompareAndSwap(bidWaiting, bidAbandoned) {
						delete(waiting, x)
						f.j.setLive(f.run.At, watching, -1)
					} // else answered: acted on as it arrives, as contend would
				}
			}
		}
	})
}

// firstAnswer acts on the answer to f's first bid, as contend acts on any.
// A won run is decided on a goroutine of its own (granted may release,
// and hands the run back to standing by if the grant came too late), and
// so is a run that must stand by.
func (d *dispatcher) firstAnswer(ctx, execCtx context.Context, f *firstBid, cl *claim.Claim, err error) {
	c := &contention{j: f.j, run: f.run}
	at := f.run.At
	if err == nil {
		d.goStandby(func() {
			defer f.j.setLive(at, watching, -1)
			if !d.answered(ctx, execCtx, c, cl, nil) {
				d.standBy(ctx, execCtx, c)
			}
		})
		return
	}
	if d.answered(ctx, execCtx, c, nil, err) {
		f.j.setLive(at, watching, -1)
		return
	}
	d.goStandby(func() {
		defer f.j.setLive(at, watching, -1)
		d.standBy(ctx, execCtx, c)
	})
}

// ranAndEnded reports whether rec is a run that ran and ended (succeeded
// or failed): no run older than it can have lived on unseen behind it but
// a takeover granted after it ended (see withHeldHere).
func ranAndEnded(rec claim.Record) bool {
	return rec.Status == claim.Succeeded || rec.Status == claim.Failed
}

// overlaps reports whether an earlier run of j still holds a claim at
// at's instant (see liveAtInstant).
func (d *dispatcher) overlaps(ctx, execCtx context.Context, j *jobState, at time.Time) bool {
	return d.liveAtInstant(ctx, execCtx, j, at, 1)
}

// liveAtInstant reports whether at least enough earlier runs of j still
// hold a claim (liveBefore) once at's instant has come on every clock.
// A replica whose clock runs ahead reaches the instant early, by up to
// MaxClockSkew: a run of its own it finds executing then may end before
// the instant comes on the backend's clock, and is no overlap. Decided
// at once, it was: the instant was skipped for a run that ended before
// it (CI, TestReplicasOnRealBackends on PostgreSQL: a clock 400ms ahead
// and a release that landed late). So while the runs executing here
// make enough, the verdict waits for them, up to MaxClockSkew past the
// instant on this clock. The wait reads nothing: runs held elsewhere
// are probed once, after it, as before (liveBefore gives them most of a
// second). The common case, nothing live, bids at once.
func (d *dispatcher) liveAtInstant(ctx, execCtx context.Context, j *jobState, at time.Time, enough int) bool {
	until := j.fire(at).Add(d.r.opts.MaxClockSkew)
	for {
		if here, _ := j.earlierLive(at); here < enough {
			break
		}
		wait := until.Sub(d.r.opts.Now())
		if wait <= 0 || !sleep(ctx, min(wait, jitter(100*time.Millisecond))) {
			break
		}
	}
	return d.liveBefore(ctx, execCtx, j, at, enough) >= enough
}

// liveBefore counts the earlier runs of j that still hold a claim, up to
// enough. A run executing here is known to; a run this replica only
// watched as held elsewhere is probed again now, because the watcher's
// last look may be stale and every replica must reach the same verdict.
func (d *dispatcher) liveBefore(ctx, execCtx context.Context, j *jobState, at time.Time, enough int) int {
	n, watched := j.earlierLive(at)
	for _, prev := range watched {
		if n >= enough {
			break
		}
		run := claim.Run{Job: j.Name, At: prev}
		cl, err := d.probeClaim(ctx, run)
		// Held, asked again:
		//   - by a holder: a claim may hold the run a moment only to
		//     record it missed or skipped (replicas starting together
		//     after an outage, a record a restarted Redis lost), so it is
		//     asked again over most of a second before it is called live,
		//     or this instant would be skipped for good for a run that
		//     never ran (outside review);
		//   - by a restart guard, not by a holder: the backend lost data
		//     and holds every run until the replicas have written back
		//     what they know, which says nothing of this run. Counted
		//     live, it cost the later instant a skip, for good, for a run
		//     that had ended (the explorer's skipped-idle, on a Redis
		//     Cluster). Asked again once the guard is over, not within
		//     it: those answers were known. A write-back extends the
		//     guard, again and again while replicas come back from a
		//     pause or a cut and write back in turn: waited out three
		//     times, each as long as its answer said, it still held
		//     the run, which was counted live and its later instant
		//     skipped for good (the explorer's skipped-idle on Redis,
		//     seed 50000029). So guards are waited out for up to 4
		//     leases, as holds are, not for a number of answers;
		//   - while the claimer holds takeovers back (a stall, an outage
		//     or refused writes just ended: claim.TakeoverHolder), a
		//     lapsed lease reads as held too, so that its holder's
		//     release lands first: the run may have ended, or its holder
		//     died, or it was a grant nobody heard of (a Redlock bid that
		//     won no majority, its abort refused). Counted live, it cost
		//     the later instant a skip, for good, though nothing ran (the
		//     explorer's skipped-idle on Redlock, seed 34000023: a stall,
		//     then refused writes). Asked again once the hold is over,
		//     up to 4 leases: the run is then done, taken over here (and
		//     live if it runs), or held by a live holder.
		wait, guarded, heldBack := 100*time.Millisecond, time.Duration(0), time.Duration(0)
	asking:
		for errors.Is(err, claim.ErrHeld) {
			left, byGuard := guardLeft(err, d.r.opts.Now())
			switch {
			case byGuard:
				// Not less than lease/8: the guard's end is on the
				// backend's clock, and on a clock running ahead it reads
				// as passed while the guard still holds.
				step := min(max(left, d.r.opts.Lease/8)+jitter(50*time.Millisecond), d.r.opts.Lease)
				if guarded >= 4*d.r.opts.Lease || !sleep(ctx, step) {
					break asking
				}
				guarded += step
			case heldBack < 4*d.r.opts.Lease && d.r.takeoversHeld():
				step := jitter(d.r.opts.Lease / 4)
				if !sleep(ctx, step) {
					break asking
				}
				heldBack += step
			default:
				if wait > 400*time.Millisecond || !sleep(ctx, jitter(wait)) {
					break asking
				}
				wait *= 2
			}
			cl, err = d.probeClaim(ctx, run)
		}
		switch {
		case err == nil:
			// Its holder died: granted() hands it back as a missed run
			// (its window has passed) or runs it (then it is live), as
			// its watcher here would have: a takeover, a request with its
			// own overlap, a catch-up run in its turn. A retry's backoff
			// is over: its claim was free.
			o := j.watchedOrigin(prev)
			o.after = 0
			d.granted(ctx, execCtx, j, cl, o)
			if j.isExecuting(prev) {
				n++
			}
		case errors.Is(err, claim.ErrDone):
		default: // held; or Run is stopping
			if !errors.Is(err, claim.ErrHeld) && ctx.Err() == nil {
				d.r.unreachableAt.Store(d.r.opts.Now().UnixNano())
			}
			n++
			if l := d.r.opts.Logger; ctx.Err() == nil && l.Enabled(ctx, slog.LevelDebug) {
				// Why a later instant may be skipped for overlap: the
				// answer that kept the earlier run live, and how long
				// it was asked about.
				l.DebugContext(ctx, "earlier run counted live", append(runAttrs(d.r, claim.Run{Job: j.Name, At: at.UTC()}, nil),
					"previous_run_id", run.ID(), "answer", fmt.Sprint(err), "guarded", guarded, "held_back", heldBack)...)
			}
		}
	}
	return n
}

// guardLeft reports whether err is a claim held by the backend's
// restart guard (a claim.DataLossError), and how long it has left by
// now on this replica's clock.
func guardLeft(err error, now time.Time) (time.Duration, bool) {
	var loss *claim.DataLossError
	if !errors.Is(err, claim.ErrHeld) || !errors.As(err, &loss) {
		return 0, false
	}
	return max(loss.Until.Sub(now), 0), true
}

// probeClaim bids for run, an earlier instant an overlap probe asks
// about, until the backend answers: granted, done, held or invalid (or
// ctx, Run's, ends). An unanswered bid says nothing of the run, and
// counted as live it would cost the later instant a skip, recorded for
// good, when the run had just ended (an outside review: connections
// dropped by pg_terminate_backend skipped instants as overlap with
// nothing live, and they never ran). The skip could not be recorded
// before the backend answers anyway.
func (d *dispatcher) probeClaim(ctx context.Context, run claim.Run) (*claim.Claim, error) {
	for attempt := 0; ; attempt++ {
		cl, err := d.claim(ctx, run)
		if err == nil || errors.Is(err, claim.ErrDone) || errors.Is(err, claim.ErrHeld) || errors.Is(err, claim.ErrInvalid) ||
			errors.Is(err, errClosing) || ctx.Err() != nil {
			return cl, err
		}
		if !sleep(ctx, jitter(min(d.r.opts.RenewEvery, time.Duration(1<<min(attempt, 6))*50*time.Millisecond))) {
			return nil, err
		}
	}
}

// hold waits until this replica's share of spread past run's start (its
// instant, jittered) before its first bid for run (see Options.Spread).
// The hold counts from the start, not from now: a replica that took
// longer to get to the run (thousands due at once) does not bid later for
// it. It returns false if ctx (Run's) ended the wait.
func (d *dispatcher) hold(ctx context.Context, j *jobState, run claim.Run, spread time.Duration) bool {
	wait := d.r.holdOf(run.ID(), spread) - d.r.opts.Now().Sub(j.fire(run.At))
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	select {
	case <-ctx.Done():
		t.Stop()
		return false
	case <-t.C:
		return true
	}
}

// holdFor maps (run id, instance) uniformly onto [0, spread).
func holdFor(runID, instance string, spread time.Duration) time.Duration {
	if spread <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(runID))
	h.Write([]byte{0})
	h.Write([]byte(instance))
	// FNV's last bytes barely reach the high bits; mix them (splitmix64's
	// finalizer) so instances that differ in one character spread too.
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return time.Duration(float64(x>>11) / (1 << 53) * float64(spread))
}

// contend claims run, standing by while another replica holds it, until the
// run is won, done, or no longer worth waiting for (ctx, Run's, ended).
// With a skip reason, a won run is not executed but ended as skipped for
// that reason, so that the decision is a fact of the backend (history,
// status page, the other replicas) rather than a line in each replica's
// log. A won run executes under execCtx.
func (d *dispatcher) contend(ctx, execCtx context.Context, j *jobState, run claim.Run, o origin, skip string) {
	if o.after > 0 && !sleep(ctx, o.after) {
		return
	}
	c := &contention{j: j, run: run, o: o, skip: skip}
	for attempt := 0; ; attempt++ {
		cl, err := d.claim(ctx, run)
		if d.answered(ctx, execCtx, c, cl, err) || !sleep(ctx, c.wait(d.r, attempt)) {
			return
		}
	}
}

// standBy goes on contending for c's run after its first bid, which
// bidTogether sent: it stands by first.
func (d *dispatcher) standBy(ctx, execCtx context.Context, c *contention) {
	for attempt := 0; ; attempt++ {
		if !sleep(ctx, c.wait(d.r, attempt)) {
			return
		}
		cl, err := d.claim(ctx, c.run)
		if d.answered(ctx, execCtx, c, cl, err) {
			return
		}
	}
}

// contention is one run contended for, and what its bids so far said.
type contention struct {
	j    *jobState
	run  claim.Run
	o    origin
	skip string
	// unavailable is the error of the current streak of failed claims;
	// unreachable says a claim failed at all.
	unavailable             error
	heldLogged, unreachable bool
}

// answered acts on the answer to one bid for c's run, and reports whether
// contending is over: won (and executed or ended as skipped), done, or
// ctx (Run's) ended.
func (d *dispatcher) answered(ctx, execCtx context.Context, c *contention, cl *claim.Claim, err error) bool {
	r := d.r
	if err == nil || errors.Is(err, claim.ErrDone) || errors.Is(err, claim.ErrHeld) {
		r.claimsAnswered(ctx)
	}
	switch {
	case err == nil && c.skip != "" && !d.requestedAlongside(ctx, c) && !d.takenOverAlongside(ctx, c, cl):
		d.skip(ctx, c.run, cl, c.skip, slog.LevelInfo)
		d.release(ctx, cl, claim.Skipped)
		return true
	case err == nil:
		if c.o.late == "" && c.unreachable {
			// Late now, it was the backend's fault.
			c.o.late = MissedUnavailable
		}
		// false: the grant came back too late to trust and was handed
		// back as interrupted: keep contending, or nobody may run it.
		return d.granted(ctx, execCtx, c.j, cl, c.o)
	case errors.Is(err, claim.ErrDone):
		if c.o.unwatched {
			d.noteDone(c.run)
		}
		d.skip(ctx, c.run, nil, ReasonDone, slog.LevelDebug)
		return true
	case errors.Is(err, claim.ErrHeld):
		var loss *claim.DataLossError
		if errors.As(err, &loss) {
			r.dataLost(ctx, loss)
		}
		if !c.heldLogged {
			d.skip(ctx, c.run, nil, ReasonHeld, slog.LevelDebug)
			c.heldLogged = true
		}
		c.unavailable = nil
	case ctx.Err() != nil:
		return true
	default:
		// Fail closed: nothing runs unclaimed. Log the first failure of a
		// streak once, at error; the claim is retried.
		if c.unavailable == nil {
			r.claimFailed(ctx, c.run, err)
		}
		c.unavailable, c.unreachable = err, true
		r.unreachableAt.Store(r.opts.Now().UnixNano())
	}
	return false
}

// requestedAlongside reports whether c, contended for only to record it
// skipped for overlap, is a run requested with overlap allow after all:
// its request was not known when the skip was decided (a replica cut off
// from the backend, or slowed by it, then; explorer seeds 190145 and
// 193350), and the backend that just granted it answers now. Then it
// runs as its request asked.
func (d *dispatcher) requestedAlongside(ctx context.Context, c *contention) bool {
	if c.skip != ReasonOverlap || c.o.request != nil {
		return false
	}
	q := d.r.requestOf(ctx, c.run)
	if q == nil || q.Overlap != OverlapAllow {
		return false
	}
	c.o.request = q
	return true
}

// takenOverAlongside reports whether c, contended for only to record it
// skipped for overlap, was granted as the takeover of a run its first
// holder executed beside its job's live runs (a backfill's run): then it
// runs, as that holder did.
//
// Unable to tell (the register out of reach, or shutting down), it says
// yes: the run then goes on to execute, where the overlap probe asks the
// same question again and, still unable to tell, hands the run back
// rather than skip it for good.
func (d *dispatcher) takenOverAlongside(ctx context.Context, c *contention, cl *claim.Claim) bool {
	if c.skip != ReasonOverlap || cl.Attempt == 1 {
		return false
	}
	along, err := d.startedAlongside(ctx, cl.Run)
	if err != nil {
		return true
	}
	c.o.alongside = along
	return along
}

// startedAlongside reports whether the register names run as executed
// beside its job's live runs (control.Unwatched.Alongside: a backfill's
// run), reading the register afresh if this replica has not seen it so:
// a takeover of such a run, skipped for overlap, would never run, and a
// backfill run again keeps a skipped instant. Asked only on the way to
// such a skip. An entry outlives its holder by unwatchedTTL and
// unwatchedOutage: a takeover
// later than that (the backend down for longer) goes by the policy. The
// error says the register could not be read.
func (d *dispatcher) startedAlongside(ctx context.Context, run claim.Run) (bool, error) {
	r := d.r
	if r.isAlongside(run) {
		return true, nil
	}
	if r.opts.Controls == nil {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
	snap, err := r.opts.Controls.Snapshot(rctx, false)
	cancel()
	if err != nil {
		return false, fmt.Errorf("read the register for a backfill's run: %w", err)
	}
	r.noteAlongside(snap.Unwatched)
	return r.isAlongside(run), nil
}

// wait is how long to stand by after the bid numbered attempt. With
// overlap forbidden a held run keeps later instants skipped while it
// lives, so standing by lasts until it ends; the takeover itself is
// bounded in granted().
func (c *contention) wait(r *Runner, attempt int) time.Duration {
	switch {
	case c.unavailable != nil:
		return jitter(min(r.opts.RenewEvery, time.Duration(1<<min(attempt, 6))*50*time.Millisecond))
	case c.o.after > 0 && attempt < 6:
		// A retry's lease lapses on the backend's clock, a moment after
		// this replica's: ask again soon (until another replica is found
		// running it).
		return jitter(min(r.opts.RenewEvery, time.Duration(1<<min(attempt, 6))*20*time.Millisecond))
	}
	return jitter(r.opts.RenewEvery)
}

// sleep waits for d, and reports false if ctx ended the wait first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// claim makes one bounded claim call, timed and counted. ctx is Run's:
// a bidder it stops leaves its bid (see batcher.claim).
func (d *dispatcher) claim(ctx context.Context, run claim.Run) (*claim.Claim, error) {
	r := d.r
	if r.isClosing() {
		return nil, errClosing
	}
	return d.batch.claim(ctx, run)
}

// granted decides what to do with a won claim.
// It returns false when the grant arrived too late to trust and was handed
// back, so the caller should go on contending for the run. ctx is Run's;
// the execution it starts, if any, runs under execCtx.
func (d *dispatcher) granted(ctx, execCtx context.Context, j *jobState, cl *claim.Claim, o origin) bool {
	r := d.r
	now := r.opts.Now()
	// A scheduled run first granted long after its instant (the backend was
	// out of reach meanwhile, or this replica fell behind) passed its
	// deadline however it was dispatched: its misfire policy decides, as
	// for a run found late at start-up. Retention is sized to that window
	// (config.ClaimWindow), not to how long an outage lasts. A manual run
	// (a request, a backfill's rerun) carries its request's time, not a
	// deadline.
	late := r.pastDeadline(j, cl.Run, now)
	// A run start-up's recovery found live that comes back as attempt 1
	// was never started: what the history showed was a failed bid's
	// leftovers (copies a Redlock minority still holds, reported at their
	// widest). It is no takeover but an instant missed while no replica
	// was up, and runs only if start-up's misfire decision runs it: the
	// look-back instant, or one of run-all's catch-up, not every instant
	// within the grace.
	notStarted := o.takeover && cl.Attempt == 1 && late && !j.ranAtStart(cl.Run.At)
	if notStarted {
		o.late = MissedNoReplica
	}
	if late && o.late == "" {
		o.late = MissedBehind
		if u := r.unreachableAt.Load(); u != 0 && time.Unix(0, u).After(j.fire(cl.Run.At)) {
			// A claim here failed since the run fell due: whichever path
			// won it now (an overlap probe, a contention started after
			// the outage), the backend kept it from starting in time.
			o.late = MissedUnavailable
		}
	}
	if o.request == nil {
		// A request's run won by a path that did not know the request (a
		// takeover at start-up, an overlap probe, another replica's
		// handback) is still the request's.
		o.request = r.requestOf(ctx, cl.Run)
	}
	switch {
	case d.tooLate(ctx, cl):
		return false
	case cl.Attempt == 1 && !o.takeover && o.request == nil && !control.Manual(cl.Run) && r.paused(ctx, j.Name):
		// A scheduled instant never started, of a job paused: recorded
		// skipped, whatever path won it. start skips a paused job's
		// instants before it bids, but a job can be paused after that,
		// and an overlap probe (liveBefore) can win an instant whose
		// watcher here was about to end it as paused: it must not run
		// (a paused job's on-time instants at start-up, under -race).
		d.skip(ctx, cl.Run, cl, ReasonPaused, slog.LevelInfo)
		d.release(ctx, cl, claim.Skipped)
	case late && cl.Attempt == 1 && (notStarted || !j.runsLate(cl.Run.At, now)):
		// Only a run that never started is missed. A later attempt is a
		// takeover of a run whose holder died or handed it back: it ran on
		// time and must finish, however late this replica came to it.
		ctx, _, span := r.startRun(ctx, ctx, cl)
		span.SetAttributes(attrReason.String(o.late))
		d.missed(ctx, cl.Run, cl, o.late)
		d.release(ctx, cl, claim.Missed)
		endRun(span, claim.Missed, nil)
	case !d.withinAttempts(ctx, j, cl):
		ctx, _, span := r.startRun(ctx, ctx, cl)
		err := fmt.Errorf("attempt %d exceeds max_attempts %d", cl.Attempt, j.MaxAttempts)
		d.finished(ctx, cl, claim.Failed, 0, err)
		d.release(ctx, cl, claim.Failed)
		endRun(span, claim.Failed, err)
	default:
		d.recordSchedule(ctx, j, cl, o) // the version this run is of, in the background (drift.go)
		if q := o.request; q != nil && cl.Attempt == 1 {
			// Who asked and why, said once, by the replica that runs it.
			r.log.InfoContext(ctx, "run requested", append(runAttrs(r, cl.Run, cl),
				"request_id", q.ID, "by", q.By, "note", q.Note)...)
		}
		// Live before the standby that won it stops counting, so a later
		// instant never sees a gap and overlaps this run.
		j.setLive(cl.Run.At, executing, +1)
		d.exec.Go(func() {
			status := d.execute(ctx, execCtx, j, cl, o.admission(), !o.unwatched)
			if status != claim.LeaseLost && status != claim.Retrying || ctx.Err() != nil {
				j.setLive(cl.Run.At, executing, -1)
				return
			}
			// The run was handed back or taken over, or is to be retried,
			// not finished: stand by for it like any replica, or it may be
			// left to nobody (the other standbys may have stopped
			// meanwhile). A retry is due once its backoff has passed. A
			// request's run stays the request's: its overlap is its own
			// (explorer: a retry of a run requested with overlap allow
			// was skipped behind the live run it was asked to run beside).
			next := origin{takeover: true, request: o.request, alongside: o.alongside}
			if status == claim.Retrying {
				next.after = j.backoff(cl.Attempt)
			}
			j.watch(cl.Run.At, next)
			j.setLive(cl.Run.At, executing, -1)
			defer j.setLive(cl.Run.At, watching, -1)
			d.contend(ctx, execCtx, j, cl.Run, next, "")
		})
	}
	return true
}

// tooLate hands cl back as interrupted, and reports true, when it reached
// this replica only after the window in which its lease may be trusted (a
// stalled process, an overloaded host, a slow backend): the lease may be
// gone and another replica running the run. keepAlive would cancel the
// handler at once, but it would have started. ctx is Run's.
func (d *dispatcher) tooLate(ctx context.Context, cl *claim.Claim) bool {
	r := d.r
	late := time.Since(cl.TrustedUntil(r.trustMargin()))
	if late < 0 {
		return false
	}
	err := fmt.Errorf("claim reached the handler %v past its trust window: %w", late.Round(time.Millisecond), claim.ErrLeaseLost)
	r.opts.Logger.WarnContext(ctx, "lease not confirmed in time; not starting run", runAttrs(r, cl.Run, cl)...)
	d.release(ctx, cl, claim.Interrupted)
	d.finished(ctx, cl, claim.LeaseLost, 0, err)
	return true
}

// claimLogEvery is how often, at most, a replica logs a failed claim.
const claimLogEvery = 5 * time.Second

// claimFailed logs the first failure of run's streak of failed claims,
// unless a failure was logged less than claimLogEvery ago: then it is
// counted, and the next line says how many runs failed unlogged since
// (others_failed). The metric counts every one.
func (r *Runner) claimFailed(ctx context.Context, run claim.Run, err error) {
	now := time.Now().UnixNano()
	last := r.claimLoggedAt.Load()
	if last != 0 && now-last < int64(claimLogEvery) || !r.claimLoggedAt.CompareAndSwap(last, now) {
		r.claimQuiet.Add(1)
		return
	}
	attrs := append(runAttrs(r, run, nil), "error", err.Error())
	if n := r.claimQuiet.Swap(0); n > 0 {
		attrs = append(attrs, "others_failed", n)
	}
	r.log.ErrorContext(ctx, "claim failed; retrying", attrs...)
}

// claimsAnswered, on a claim the backend answered, says how many runs'
// failed claims went unlogged (claimFailed) since the last line, if any.
func (r *Runner) claimsAnswered(ctx context.Context) {
	if r.claimQuiet.Load() == 0 {
		return
	}
	if n := r.claimQuiet.Swap(0); n > 0 {
		r.log.WarnContext(ctx, "claims answered again", "instance", r.opts.Instance, "claimer", r.opts.ClaimerName,
			"failed_unlogged", n)
	}
}

// jitter spreads retries of replicas that lost the same bid by ±20%.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + rand.N(2*d/5+1)
}

// What a live entry is: a run executing on this replica, or one this
// replica contends for or watches as held elsewhere.
const (
	executing = iota
	watching
)

// fire is when j's run at starts: its instant, jittered (see
// Job.Jitter); a manual run (a request, a rerun) starts when asked.
func (j *jobState) fire(at time.Time) time.Time {
	if j.Jitter <= 0 || control.Manual(claim.Run{At: at}) {
		return at
	}
	return j.Schedule.Jittered(j.Name, at, j.Jitter)
}

// pastDeadline reports whether run, of j, is past the late tolerance at
// now (the replica's clock): a scheduled instant that was not started by
// then is missed unless its misfire policy runs it late (runsLate). A
// manual run (a request, a backfill's rerun) has no deadline.
func (r *Runner) pastDeadline(j *jobState, run claim.Run, now time.Time) bool {
	return !control.Manual(run) && now.Sub(j.fire(run.At)) > r.lateTolerance()
}

// runsLate reports whether j's misfire policy still runs an instant at,
// past its deadline, at now: run-once or run-all, within the grace.
func (j *jobState) runsLate(at, now time.Time) bool {
	return (j.Misfire == MisfireRunOnce || j.Misfire == MisfireRunAll) && now.Sub(at) <= j.Grace
}

// runsAtStart notes that start-up's misfire decision runs j's instant at,
// past its deadline; ranAtStart reports whether it did.
func (j *jobState) runsAtStart(at time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.lateAtStart == nil {
		j.lateAtStart = map[int64]bool{}
	}
	j.lateAtStart[at.UnixNano()] = true
}

func (j *jobState) ranAtStart(at time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.lateAtStart[at.UnixNano()]
}

func (j *jobState) setLive(at time.Time, kind, delta int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.setLiveLocked(at.UnixNano(), kind, delta)
}

// setLiveLocked is setLive for the caller that holds j.mu; k is the
// instant in unix ns.
func (j *jobState) setLiveLocked(k int64, kind, delta int) {
	e := j.live[k]
	e[kind] += delta
	if e == [2]int{} {
		delete(j.live, k)
	} else {
		j.live[k] = e
	}
	if e[watching] == 0 {
		delete(j.watchedAs, k)
	}
}

// watch makes j's run at live here (watching), dispatched as o, until
// setLive(at, watching, -1) ends the watch. Both under one lock: an
// overlap probe never finds the run watched but its origin not yet kept.
func (j *jobState) watch(at time.Time, o origin) {
	k := at.UnixNano()
	j.mu.Lock()
	defer j.mu.Unlock()
	j.setLiveLocked(k, watching, +1)
	if o == (origin{}) {
		return
	}
	if j.watchedAs == nil {
		j.watchedAs = map[int64]origin{}
	}
	j.watchedAs[k] = o
}

// watchedOrigin is why j's run at, watched here, was dispatched.
func (j *jobState) watchedOrigin(at time.Time) origin {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.watchedAs[at.UnixNano()]
}

// earlierLive counts the runs of j before at executing here, and lists
// the earlier runs this replica only watches.
//
// A run executing here whose lease this replica no longer trusts is not
// counted: it is ending (its handler cancelled, or its outcome decided
// and its release not yet landed), and the other replicas, reading its
// lapsed lease, count it no more. Counted, it skipped a later instant
// for good on this replica alone (the explorer's skipped-idle, in-process
// seed 60000450: a run granted before a long pause of its replica,
// recorded missed after it, its release held up by an outage, kept the
// job's instants due meanwhile from running).
func (j *jobState) earlierLive(at time.Time) (n int, watched []time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for k, e := range j.live {
		switch {
		case k >= at.UnixNano():
		case e[executing] > 0 && !j.lapsedHereLocked(k):
			n++
		case e[watching] > 0:
			watched = append(watched, time.Unix(0, k).UTC())
		}
	}
	return n, watched
}

// lapsedHereLocked reports whether every run of j at instant k (unix ns)
// this replica holds (hold) has a lease it no longer trusts; false where
// it holds none (between its grant and hold).
func (j *jobState) lapsedHereLocked(k int64) bool {
	found := false
	for _, h := range j.held {
		if h.rec.At.UnixNano() != k {
			continue
		}
		if h.isTrusted() {
			return false
		}
		found = true
	}
	return found
}

// heldRun is a run this replica executes (jobState.hold): its record, as
// granted, and until when this replica trusts its lease (the keep-alive
// moves it on at each renewal; nil once the lease is lost).
type heldRun struct {
	rec     claim.Record
	trusted *atomic.Pointer[time.Time]
}

// isTrusted reports whether this replica still trusts h's lease.
func (h heldRun) isTrusted() bool {
	t := h.trusted.Load()
	return t != nil && time.Now().Before(*t)
}

// hold records cl, granted at grantedAt on the backend's clock, as
// executed here until the function it returns is called, its lease
// trusted until margin before cl's trust window closes; the keep-alive
// moves that on (trusted).
func (j *jobState) hold(cl *claim.Claim, grantedAt time.Time, margin time.Duration) (trusted *atomic.Pointer[time.Time], drop func()) {
	id := cl.ID()
	trusted = new(atomic.Pointer[time.Time])
	until := cl.TrustedUntil(margin)
	trusted.Store(&until)
	j.mu.Lock()
	defer j.mu.Unlock()
	j.held[id] = heldRun{rec: claim.Record{RunID: id, Job: cl.Run.Job, At: cl.Run.At, Status: claim.Running, Holder: cl.Holder,
		Fence: cl.Fence, Attempt: cl.Attempt, StartedAt: grantedAt}, trusted: trusted}
	return trusted, func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.held[id].rec.Fence == cl.Fence {
			delete(j.held, id)
		}
	}
}

// heldHere returns the runs of j this replica executes (see hold) but
// the one whose id is except; nil, without allocating, when there are
// none (every probe asks, and most runs are their job's only one here).
func (j *jobState) heldHere(except string) []heldRun {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []heldRun
	for id, h := range j.held {
		if id != except {
			out = append(out, h)
		}
	}
	return out
}

// isLive reports whether j's run at executes or is watched here.
func (j *jobState) isLive(at time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	_, ok := j.live[at.UnixNano()]
	return ok
}

// adopt stands by, like start-up recovery, for each of runs (live runs
// of j an overlap probe found, older than the run it probed for) that
// this replica neither executes nor watches. Such a run is watched by
// nobody when its instant is on no schedule the fleet runs now (a grant
// that landed after its holder's process exited, for an instant only
// that process's version named; a backfill's run), and older than what
// start-up recovery reads (explorer seed 133110: a claim from a stopped
// incarnation, held in a stalled server's socket, landed after its
// successor had read the history; its run stayed live for good). A
// holder that lives keeps it: the standby hears done in the end. Each
// is started as o: a takeover, beside live runs of the job if its entry
// in the register says its holder ran it so (a backfill's run).
func (d *dispatcher) adopt(ctx, execCtx context.Context, j *jobState, runs []claim.Record, o origin) {
	if !d.adopts {
		return
	}
	for _, rec := range runs {
		if !j.isLive(rec.At) {
			d.r.log.DebugContext(ctx, "standing by for a live run nobody here watched", append(runAttrs(d.r, claim.Run{Job: j.Name, At: rec.At}, nil),
				"holder", rec.Holder, "attempt", rec.Attempt)...)
			d.start(ctx, execCtx, j, rec.At, o, 0)
		}
	}
}

// isExecuting reports whether j's run at executes here.
func (j *jobState) isExecuting(at time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.live[at.UnixNano()][executing] > 0
}
