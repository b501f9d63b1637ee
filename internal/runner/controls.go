// This file owns the operator's controls as a replica honours them: it
// reads the pause switches and run requests from the backend every
// ControlEvery, skips the instants of a paused job, and dispatches each
// requested run like a scheduled one. Neither needs agreement between
// replicas: a run is claimed whatever a replica thinks of it, so a pause
// that reaches one replica before another still decides each instant once.
// The same read brings the schedule entries the drift guard compares
// (drift.go).

package runner

import (
	"context"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// readPauses refreshes the pause switches, bounded by a third of the lease;
// on failure the last known switches stay.
func (r *Runner) readPauses(ctx context.Context) {
	if r.opts.Controls == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
	defer cancel()
	if ps, err := r.opts.Controls.Pauses(ctx); err == nil {
		r.setPauses(ctx, ps)
	}
}

// setPauses installs ps and logs each job whose switch changed here: a
// job's own switch one line per job, the switch of every job (--all) one
// line with the count of jobs it changed (a line per job was 2,000 lines
// per replica for one `pause --all`, an outside review).
func (r *Runner) setPauses(ctx context.Context, ps control.Pauses) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pauses.Store(&ps)
	msg := func(p control.Pause) string {
		if p.Paused {
			return "job paused"
		}
		return "job resumed"
	}
	var all control.Pause
	changedByAll := 0
	for _, j := range r.jobs {
		p, _ := ps.Of(j.Name)
		if p.Paused == r.pausedLogged[j.Name] {
			continue
		}
		r.pausedLogged[j.Name] = p.Paused
		if p.Job == control.AllJobs {
			all = p
			changedByAll++
			continue
		}
		r.log.InfoContext(ctx, msg(p), "job", j.Name, "instance", r.opts.Instance, "by", p.By, "note", p.Note,
			"at", p.At.Format(time.RFC3339Nano))
	}
	if changedByAll > 0 {
		r.log.InfoContext(ctx, msg(all), "job", control.AllJobs, "jobs", changedByAll, "instance", r.opts.Instance,
			"by", all.By, "note", all.Note, "at", all.At.Format(time.RFC3339Nano))
	}
}

// paused reports whether job is paused, reading the switches first if no
// read has succeeded yet. A replica that cannot read them runs the job: the
// backend that keeps them is the one every claim needs, so a replica
// that cannot read them cannot claim either.
func (r *Runner) paused(ctx context.Context, job string) bool {
	ps := r.pauses.Load()
	if ps == nil {
		r.readPauses(ctx)
		if ps = r.pauses.Load(); ps == nil {
			return false
		}
	}
	return ps.Paused(job)
}

// setRequests installs reqs as the requests last read.
func (r *Runner) setRequests(reqs []control.Request) {
	byRun := make(map[string]*control.Request, len(reqs))
	for i := range reqs {
		byRun[reqs[i].Run().ID()] = &reqs[i]
	}
	r.requests.Store(&byRun)
}

// noteAlongside remembers the runs of us whose holders were granted
// them to execute beside their job's live runs (Runner.alongside). An
// entry not marked granted names a bid only: the run may have gone to
// the fleet on its schedule, under its policy.
func (r *Runner) noteAlongside(us []control.Unwatched) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range us {
		if u.Alongside && u.Granted {
			if len(r.alongside) >= maxUnrequested {
				clear(r.alongside)
			}
			r.alongside[u.Run().ID()] = true
		}
	}
}

// isAlongside reports whether the register named run as executed beside
// its job's live runs (noteAlongside).
func (r *Runner) isAlongside(run claim.Run) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.alongside[run.ID()]
}

// requestOf returns the request that asked for run, a manual run, or nil
// (a backfill's rerun, a request no longer remembered). A run's takeover
// or retry is still the request's: it runs beside a live run if the
// request said so, on whichever replica. A run the requests last read do
// not name is looked up afresh: start-up recovery may take a request's
// run over before the first tick, and a replica cut off from the backend
// when the request was made may come to its run (an overlap probe
// adopts it) before a tick has read it (explorer seed 4750).
func (r *Runner) requestOf(ctx context.Context, run claim.Run) *control.Request {
	if r.opts.Controls == nil || !control.Manual(run) {
		return nil
	}
	if reqs := r.requests.Load(); reqs != nil {
		if q := (*reqs)[run.ID()]; q != nil {
			return q
		}
	}
	r.mu.Lock()
	known := r.unrequested[run.ID()]
	r.mu.Unlock()
	if known {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, r.opts.Lease/2)
	got, err := r.opts.Controls.Requests(rctx)
	cancel()
	if err != nil {
		return nil
	}
	r.setRequests(got)
	q := (*r.requests.Load())[run.ID()]
	if q == nil {
		// A request is written before any claim of its run, so a run a
		// fresh read does not name never becomes one (a trigger --here
		// run, a backfill's rerun): the sweep, the overlap probe and the
		// grant that come to it need not read the register again.
		r.mu.Lock()
		if len(r.unrequested) >= maxUnrequested {
			clear(r.unrequested)
		}
		r.unrequested[run.ID()] = true
		r.mu.Unlock()
	}
	return q
}

// maxUnrequested bounds Runner.unrequested: past it, the runs it names
// are read afresh again, once each.
const maxUnrequested = 10_000

// watchControls reads the controls every ControlEvery until ctx (Run's)
// is done, and dispatches the runs requested of this replica's jobs.
func (d *dispatcher) watchControls(ctx, execCtx context.Context) {
	r := d.r
	if r.opts.Controls == nil {
		return
	}
	seen := map[string]bool{} // requests dispatched here, by id
	drift, stop := d.guardDrift()
	defer stop()
	// The fleet learns of this replica, and it of the fleet, before the
	// first tick: the runs due in the first second are shared out too.
	r.announce(ctx, true)
	defer r.leave(ctx)
	t := time.NewTicker(r.opts.ControlEvery)
	defer t.Stop()
	schedules := true // read at the first tick, then every scheduleReadEvery
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var wg sync.WaitGroup
		wg.Go(func() { r.announce(ctx, false) })
		rctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
		snap, err := r.opts.Controls.Snapshot(rctx, schedules)
		cancel()
		wg.Wait()
		if err != nil {
			continue // the last known switches and members stay; requests wait
		}
		r.setMembers(snap.Members)
		r.setPauses(ctx, snap.Pauses)
		r.setRevoked(snap.Revoked)
		r.setRequests(snap.Requests)
		d.requests(ctx, execCtx, snap.Requests, seen)
		r.noteAlongside(snap.Unwatched)
		d.unwatched(ctx, execCtx, snap.Unwatched)
		if schedules {
			drift.compare(ctx, snap.Schedules)
		}
		schedules = tick%scheduleReadEvery == 0
	}
}

// requests dispatches every request of a job of this replica it has not
// dispatched yet and that is still within its job's window (a request
// nobody picked up in time is not run at a surprising hour; it stays
// remembered, so a retry of it does not run either). seen is pruned to
// the requests still remembered.
func (d *dispatcher) requests(ctx, execCtx context.Context, reqs []control.Request, seen map[string]bool) {
	r := d.r
	listed := map[string]bool{}
	now := r.opts.Now()
	for _, req := range reqs {
		listed[req.ID] = true
		j := r.job(req.Job)
		if j == nil || seen[req.ID] || now.Sub(req.Created) > RequestWindow(j.Grace, r.opts.MaxClockSkew) {
			continue
		}
		seen[req.ID] = true
		r.log.DebugContext(ctx, "request seen", "job", req.Job, "run_id", req.Run().ID(), "request_id", req.ID,
			"instance", r.opts.Instance)
		d.start(ctx, execCtx, j, req.At, origin{request: &req}, 0)
	}
	for id := range seen {
		if !listed[id] {
			delete(seen, id)
		}
	}
}

// job returns the job called name, or nil.
func (r *Runner) job(name string) *jobState {
	return r.byName[name]
}

// Paused reports the pause switch that governs job as this replica last
// read it.
func (r *Runner) Paused(job string) (control.Pause, bool) {
	ps := r.pauses.Load()
	if ps == nil {
		return control.Pause{}, false
	}
	return ps.Of(job)
}
