// This file owns what an execution does about an earlier run of its job
// that is still live, under the job's overlap policy:
//
//   - forbid: the later run is skipped (execute's owner probe);
//   - allow: nothing;
//   - buffer-one: one later instant waits for the live run and starts
//     when it ends; an instant that finds one already waiting is skipped
//     (the verdict is dispatch's, see bufferFull);
//   - replace: the later run revokes the live one, whichever replica holds
//     it, and starts once it has stopped.
//
// Waiting is decided by the backend, not by this replica's memory: the
// owner probe reads the job's recent records, which every replica sees
// alike, and a waiting run holds its claim (kept alive) meanwhile, so no
// replica runs it elsewhere and later instants meet it live.

package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// ReasonReplaced is the skip reason of a run revoked by a later instant of
// its job under overlap: replace.
const ReasonReplaced = "replaced"

// admission says how an execution treats an earlier live run of its job.
type admission int

const (
	// admitByPolicy: the job's overlap policy decides.
	admitByPolicy admission = iota
	// admitAlways: overlap allowed, a request with --overlap allow or a
	// backfill's run.
	admitAlways
	// admitInTurn: wait for earlier runs to end, whatever the policy: a
	// run caught up after an outage (misfire: run-all).
	admitInTurn
)

// errReplaced is the cause a revoked run's handler is cancelled with. It
// is a lease loss to the handler (errors.Is(cause, ErrLeaseLost)): the
// run is no longer its to finish.
type errReplaced struct{ by string }

func (e errReplaced) Error() string {
	return fmt.Sprintf("replaced by %s: %v", e.by, claim.ErrLeaseLost)
}
func (e errReplaced) Unwrap() error { return claim.ErrLeaseLost }

// bufferFull reports whether an instant at of a buffer-one job finds the
// buffer taken: more than one earlier run live, the running one and one
// already waiting behind it. Every replica dispatches, and so watches,
// every instant, so each reaches the same verdict on the same facts; the
// replica that wins at applies its own.
func (d *dispatcher) bufferFull(ctx, execCtx context.Context, j *jobState, at time.Time) bool {
	return d.liveAtInstant(ctx, execCtx, j, at, 2)
}

// awaitTurn holds cl, kept alive, until no earlier live run of j owns the
// job (see owner), revoking each owner it meets first when revoke is set
// (overlap: replace). It returns nil when cl may start, the lease's cause
// if the lease was lost or the run revoked while waiting, or errStopped
// if the replica is shutting down (ctx, Run's, done): the run, not yet
// started, is handed back. ectx is the execution's context, execCtx
// Run's (for the runs adopt stands by for).
func (d *dispatcher) awaitTurn(ctx, execCtx, ectx context.Context, j *jobState, cl *claim.Claim, grantedAt time.Time, backendNow func() time.Time, page *[]claim.Record, revoke, bufferOne bool) error {
	r := d.r
	logged := false
	revoked := map[string]bool{}
	begin := time.Now()
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		p, err := d.owners(ectx, j, cl, grantedAt, backendNow, page)
		d.adopt(ctx, execCtx, j, p.unwatched, origin{takeover: true})
		if err == nil && d.waitsOut(j, p, time.Since(begin), true) {
			// Some run found may be held a moment only to be recorded
			// missed: nothing is revoked, skipped or counted on until it
			// is gone (or known for a run), asked again. Beside a real
			// owner, it would make buffer-one count two waiting and skip,
			// and replace revoke it; as the newer run, make this one
			// yield as replaced.
			if err := waitFor(ctx, ectx, wait); err != nil {
				return err
			}
			continue
		}
		owners, newer := p.owners, p.newer
		if err == nil && revoke && newer != nil {
			// A later instant is live: it replaces this one, which must
			// not start, wherever it stands in the order (a takeover of
			// an older instant granted after the newer run, its holder
			// not yet told of its revocation). The newer run waits for
			// this one if this one comes first, so it ends here.
			return errReplaced{by: newer.RunID}
		}
		if err == nil && p.ahead != nil {
			if !revoke {
				return errOvertaken
			}
			owners = append(owners, *p.ahead) // an earlier instant (no newer one is live): revoked below
		}
		if err != nil || len(owners) == 0 {
			return err
		}
		if bufferOne && len(owners) > 1 {
			// One run waits already, behind the live one: an outage can
			// leave several instants granted at once, past the verdict
			// dispatch made; the backend's records settle it here.
			return errBufferFull
		}
		// Only an earlier instant is replaced: a takeover of a revoked
		// run that came to own the job by its late grant must not revoke
		// the run that replaced it (it finds its own revocation instead).
		for _, o := range owners {
			if revoke && o.At.Before(cl.Run.At) && !revoked[o.RunID] {
				revoked[o.RunID] = true
				d.revoke(ctx, j, cl, &o)
			}
		}
		owner := owners[0]
		if !logged {
			r.opts.Logger.InfoContext(ectx, "run waiting for the previous run",
				append(runAttrs(r, cl.Run, cl), "previous_run_id", owner.RunID, "previous_holder", owner.Holder)...)
			logged = true
		}
		if err := waitFor(ctx, ectx, wait); err != nil {
			return err
		}
	}
}

// waitFor waits d, or until ectx (an execution's) ends: then it returns
// the lease's cause; or ctx (Run's): then errStopped.
func waitFor(ctx, ectx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ectx.Done():
		return context.Cause(ectx)
	case <-ctx.Done():
		return errStopped
	case <-t.C:
		return nil
	}
}

// momentaryWait bounds how long a probe asks again about runs another
// replica may hold only to record them missed (see waitsOut): such a
// claim is released within a round trip or two of its grant.
const momentaryWait = 1500 * time.Millisecond

// waitsOut reports whether a probing run, having asked for waited so
// far, should ask again rather than act on what p found: every run it
// would yield to (owners, ahead), or with anyOf any run found (newer
// too), may be held only for a moment, to be recorded missed. Such a
// claim is no run that could overlap (an outside review: a replica
// restarted after 25s down skipped its instants still on time as overlap
// with its own claims on the outage's older instants, and nothing ran). A claim this replica holds for that (recording) is
// asked about again until it is released, up to the late tolerance;
// one of another replica's is recognised by its grant, a first attempt
// granted past its deadline (replicas starting together), and asked
// about for momentaryWait. Asking again only delays the verdict: the
// run starts only once a probe finds nothing live to yield to, so a run
// mistaken for one of these (a late run its misfire policy ran) is
// yielded to in the end.
func (d *dispatcher) waitsOut(j *jobState, p probe, waited time.Duration, anyOf bool) bool {
	found := p.owners
	if p.ahead != nil {
		found = append(slices.Clip(found), *p.ahead)
	}
	if anyOf && p.newer != nil {
		found = append(slices.Clip(found), *p.newer)
	}
	if len(found) == 0 || waited > d.r.lateTolerance() {
		return false
	}
	momentary := 0
	for _, o := range found {
		if j.recordingHere(o.At) ||
			o.Attempt == 1 && o.StartedAt.Sub(j.fire(o.At)) > d.r.lateTolerance() && waited < momentaryWait {
			momentary++
		}
	}
	return anyOf && momentary > 0 || momentary == len(found)
}

// settledOwners is owners for the forbid policy's single verdict, asked
// again while waitsOut says the runs found are held only for a moment.
func (d *dispatcher) settledOwners(ctx, ectx context.Context, j *jobState, cl *claim.Claim, grantedAt time.Time, backendNow func() time.Time, page *[]claim.Record) (probe, error) {
	begin := time.Now()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		p, err := d.owners(ectx, j, cl, grantedAt, backendNow, page)
		if err != nil || !d.waitsOut(j, p, time.Since(begin), false) {
			return p, err
		}
		if err := waitFor(ctx, ectx, jitter(wait)); err != nil {
			return probe{}, err
		}
	}
}

// errBufferFull ends the wait of a buffer-one run that found another
// already waiting: it is skipped (overlap).
var errBufferFull = errors.New("runner: a run already waits for the live one")

// errOvertaken ends the wait of a run that found a run granted before it
// live, one that comes after it and so may not have seen it (see probe):
// it is skipped (overlap).
var errOvertaken = errors.New("runner: a run granted before this one, and coming after it, is live")

// errStopped ends a wait for a run's turn at shutdown: the run had not
// started, and is handed back.
var errStopped = errors.New("runner: shutting down before the run's turn came")

// revoke asks whichever replica holds owner to stop it, through the
// controls register every replica reads each tick; a replica that takes
// the revoked run over later finds the revocation and ends it instead of
// running it. Without a register, revocation cannot reach the holder:
// the run waits for it instead, as under buffer-one.
func (d *dispatcher) revoke(ctx context.Context, j *jobState, cl *claim.Claim, owner *claim.Record) {
	r := d.r
	if r.opts.Controls == nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
	defer cancel()
	if err := r.opts.Controls.Revoke(wctx, owner.RunID, cl.ID(), r.opts.Instance, r.revokeTTL()); err != nil {
		r.log.WarnContext(ctx, "cannot revoke the previous run; waiting for it", append(runAttrs(r, cl.Run, cl),
			"previous_run_id", owner.RunID, "error", err.Error())...)
		return
	}
	r.opts.Logger.Log(ctx, slog.LevelInfo, "replacing the previous run", append(runAttrs(r, cl.Run, cl),
		"previous_run_id", owner.RunID, "previous_holder", owner.Holder)...)
}

// revokeTTL is how long a revocation is kept: past the lease of any
// holder that was alive to hear it, and past a takeover of the run after
// a holder that died.
func (r *Runner) revokeTTL() time.Duration { return max(10*time.Minute, 4*r.opts.Lease) }

// track registers the cancel of an execution in progress here, so that a
// revocation read from the register reaches it; the returned func
// unregisters it.
func (r *Runner) track(id string, cancel context.CancelCauseFunc) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.running = map[string]context.CancelCauseFunc{}
	}
	r.running[id] = cancel
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.running, id)
	}
}

// setRevoked installs the revocations last read (run id → the run that
// replaced it) and cancels every execution here they name.
func (r *Runner) setRevoked(revoked map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revoked = revoked
	for id, by := range revoked {
		if cancel := r.running[id]; cancel != nil {
			cancel(errReplaced{by: by})
		}
	}
}

// replacedBy reports which run revoked run id, as last read.
func (r *Runner) replacedBy(id string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	by, ok := r.revoked[id]
	return by, ok
}
