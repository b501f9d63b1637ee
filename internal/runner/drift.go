// This file owns the schedule-drift guard. During a rolling deploy,
// replicas run two versions of a job's config at once: a changed cron
// spec, time zone or jitter. Runs stay correct without any agreement,
// because a run is keyed by its instant, not by the config that named it:
//
//   - An instant is run if either version's spec names it: each replica
//     dispatches the instants of its own version. It is claimed under its
//     own run id, job@instant, so an instant both versions name runs once.
//   - Jitter only delays a run's start; it never changes the run id.
//
// What the guard adds is that an operator learns two versions were live.
// Each job has one register entry, schedule/<job> (control.ScheduleEntry):
// the fingerprint, spec, time zone and jitter of the version that last ran
// one of its instants, who wrote it and when.
//
//   - A replica that wins the claim of a scheduled instant of a job writes
//     its own version there when the entry it last read is another
//     version's, is absent, or is older than scheduleRefresh: in a settled
//     fleet, one write per job per hour. The write runs beside the
//     execution, never before it, bounded by Lease/3; a failed one is
//     retried at the next instant won. Writes go in batches (group
//     commit, one request each where the register takes batches): the
//     thousands of jobs won at one instant cost a few round trips.
//   - Every scheduleReadEvery reads of the controls (ten seconds by
//     default) a replica reads the entries with the other controls (the
//     same round trip) and compares them with its own versions. Not at
//     every read: with thousands of jobs the entries are nearly all of
//     the register, and a conflict is news for an operator, not for the
//     next second. An entry of another version written after this replica
//     started means both versions were live at once: a schedule conflict,
//     logged (Warn) and counted (scheduler_schedule_conflicts_total{job})
//     once per job and other version. An older entry is a version that ran
//     before this replica came up, most likely the one a deploy replaced;
//     if it is still live it writes again at its next instant won, and is
//     seen then.

package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// scheduleRefresh is how old the entry of this replica's own version may
// grow before a run won here writes it again: the entry's time stays
// recent, and the entry well within control.ScheduleTTL.
const scheduleRefresh = time.Hour

// Fingerprint identifies the version of j's schedule: a short hex hash of
// spec|timezone|jitter. Two replicas that compute the same instants and
// jitter for j have the same fingerprint. (A spec written two ways that
// names the same instants, "*/2 * * * * *" and "@every 2s", counts as two
// versions: a false alarm beats parsing intent.)
func (j Job) Fingerprint() string { return version(j).Fingerprint }

// version is j's schedule as the drift guard records it.
func version(j Job) control.ScheduleEntry {
	spec, tz := j.Schedule.String(), j.Schedule.Location().String()
	sum := sha256.Sum256([]byte(spec + "|" + tz + "|" + j.Jitter.String()))
	return control.ScheduleEntry{Job: j.Name, Fingerprint: hex.EncodeToString(sum[:6]), Spec: spec,
		Timezone: tz, Jitter: j.Jitter}
}

// drift is the guard's state for one Run: its controls watcher fills it,
// its grants read it.
type drift struct {
	r       *Runner
	started time.Time
	ours    map[string]control.ScheduleEntry // this replica's versions, by job

	mu      sync.Mutex
	last    control.Schedules // as last read, or written here since
	writing map[string]bool   // jobs whose entry is queued or being written
	// q coalesces the writes: thousands of jobs due at one instant, all
	// won here at once, would otherwise each send theirs, a round trip
	// apiece competing with that instant's claims and releases.
	q      queue[control.ScheduleEntry]
	logged map[string]bool // job+"\x00"+fingerprint of the conflicts logged
}

// guardDrift starts the drift guard of d's Run and returns it with the
// function that ends it. watchControls owns it: without controls there is
// no register to write to, and a grant after the watcher stopped (at
// shutdown) records nothing.
func (d *dispatcher) guardDrift() (*drift, func()) {
	r := d.r
	dr := &drift{r: r, started: r.opts.Now(), ours: map[string]control.ScheduleEntry{},
		writing: map[string]bool{}, logged: map[string]bool{}}
	for _, j := range r.jobs {
		dr.ours[j.Name] = version(j.Job)
	}
	d.drift.Store(dr)
	return dr, func() { d.drift.Store(nil) }
}

// recordSchedule writes j's version as its schedule entry, in the
// background, if cl won a scheduled instant of j and the entry this
// replica last read is another version's, absent, or old. A manual run (a
// request, a backfill's rerun) is no instant of the schedule and writes
// nothing. The write belongs to the exec group, like the execution it
// accompanies, so Run waits for it; ctx is Run's.
func (d *dispatcher) recordSchedule(ctx context.Context, j *jobState, cl *claim.Claim, o origin) {
	if o.request != nil || control.Manual(cl.Run) {
		return
	}
	dr := d.drift.Load()
	if dr == nil {
		return
	}
	if e, due := dr.due(j.Name); due && dr.q.add(e) {
		d.exec.Go(func() { dr.send(ctx) })
	}
}

// due returns the entry to write for job, and whether to write it now: no
// write for job is under way, and the entry last read is not this
// replica's version written within scheduleRefresh.
func (dr *drift) due(job string) (control.ScheduleEntry, bool) {
	now := dr.r.opts.Now()
	dr.mu.Lock()
	defer dr.mu.Unlock()
	e, last := dr.ours[job], dr.last[job]
	if dr.writing[job] || (last.Fingerprint == e.Fingerprint && now.Sub(last.At) < scheduleRefresh) {
		return e, false
	}
	dr.writing[job] = true
	e.By, e.At = dr.r.opts.Instance, now
	return e, true
}

// scheduleReadEvery is how many reads of the controls a replica makes per
// read of the schedule entries (the first read includes them). A read
// that fails is retried at the next tick, without waiting for the next
// tenth.
const scheduleReadEvery = 10

// send writes the queued entries by group commit, as releaser sends
// releases: those queued when it starts (after a linger) in one batch,
// and those queued meanwhile together in the next (at most maxBatch),
// until none is waiting.
// A batch is bounded by Lease/3, so that a slow backend holds up nothing
// but these writes. A failure is not logged above debug: the claims,
// which need the same backend, already say so, and the next instant won
// retries.
func (dr *drift) send(ctx context.Context) {
	r := dr.r
	// The first write waits out an instant's spread, so that the runs of
	// that instant won here go in one batch or a few.
	linger := time.NewTimer(min(r.opts.Lease/10, 100*time.Millisecond))
	select {
	case <-linger.C:
	case <-ctx.Done():
		linger.Stop()
	}
	for {
		batch := dr.q.take()
		if len(batch) == 0 {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
		got, errs := r.opts.Controls.SetSchedules(wctx, batch)
		cancel()
		var failed []error
		dr.mu.Lock()
		for i, e := range batch {
			delete(dr.writing, e.Job)
			if errs[i] != nil {
				failed = append(failed, errs[i])
				continue
			}
			if dr.last == nil {
				dr.last = control.Schedules{}
			}
			dr.last[e.Job] = got[i]
		}
		dr.mu.Unlock()
		if len(failed) > 0 {
			r.log.DebugContext(ctx, "schedule entries not written", "entries", len(failed), "of", len(batch),
				"instance", r.opts.Instance, "error", failed[0].Error())
		}
	}
}

// compare installs the entries read this tick, and logs and counts, once
// per job and other version, each entry of another version of a job of
// this replica written after it started.
func (dr *drift) compare(ctx context.Context, entries control.Schedules) {
	r := dr.r
	var ours, theirs []control.ScheduleEntry
	dr.mu.Lock()
	dr.last = entries
	for job, e := range entries {
		mine, ok := dr.ours[job]
		key := job + "\x00" + e.Fingerprint
		if !ok || e.Fingerprint == mine.Fingerprint || !e.At.After(dr.started) || dr.logged[key] {
			continue
		}
		dr.logged[key] = true
		ours, theirs = append(ours, mine), append(theirs, e)
	}
	dr.mu.Unlock()
	for i, e := range theirs {
		r.log.WarnContext(ctx, "schedule conflict", "job", e.Job, "instance", r.opts.Instance,
			versionAttr("ours", ours[i]), versionAttr("theirs", e), "by", e.By, "at", e.At.Format(time.RFC3339Nano))
		r.opts.Metrics.conflict(e.Job)
	}
}

func versionAttr(key string, e control.ScheduleEntry) slog.Attr {
	return slog.Group(key, "fingerprint", e.Fingerprint, "spec", e.Spec, "timezone", e.Timezone,
		"jitter", e.Jitter.String())
}
