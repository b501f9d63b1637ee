// This file owns the replica's view of its fleet and what the view is for:
// deciding, for each run, whether to bid at once or to stand by first.
//
// Every replica announces itself in the backend's control register as it
// reads the controls (control.Announce) and reads the others' entries in
// the same pass, so each knows which replicas are up without knowing
// anything of them in advance. For each run, the member whose hash of
// (run, instance) is least owns it: the owner bids at once, the others
// hold back for the spread or more, so a run starts as soon as its
// owner gets to it, and runs due together are shared out as evenly as the
// hash spreads them, whichever replica woke first. A view that is wrong
// (a replica that just joined or died, a register that cannot be read)
// only changes who bids first: every bid is still a claim, so a run still
// happens once, and a dead owner's runs are taken by the others once
// their hold ends.

package runner

import (
	"context"
	"slices"
	"sync"
	"time"
)

// membership is the replicas this one saw up, and when it read them.
type membership struct {
	members []string  // sorted, this replica among them
	read    time.Time // on the monotonic clock
}

// memberTTL is how long an announcement lasts: five control reads, so a
// replica that misses one or two still counts, plus twice the clock skew,
// as an entry is stamped on its writer's clock and expires on the
// backend's.
func (r *Runner) memberTTL() time.Duration { return 5*r.opts.ControlEvery + 2*r.opts.MaxClockSkew }

// announce renews this replica's presence and, with read, reads the
// fleet's, each bounded by a third of the lease. A failed announcement is
// not retried before the next read of the controls: the entry outlives a
// few misses, and a replica missing from the others' view only has its
// runs started by them after their hold.
func (r *Runner) announce(ctx context.Context, read bool) {
	if r.opts.Controls == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Lease/3)
	defer cancel()
	if n := r.announced.Add(1); n%twinCheckEvery == 0 {
		r.checkTwin(ctx)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.opts.Controls.Announce(ctx, r.opts.Instance, r.memberTTL()) })
	if read {
		if ms, err := r.opts.Controls.Members(ctx); err == nil {
			r.setMembers(ms)
		}
	}
	wg.Wait()
}

// twinCheckEvery is how many announcements apart a replica looks for
// another process announcing its instance name (checkTwin).
const twinCheckEvery = 10

// checkTwin warns, at most once per twinWarnEvery, when the entry under
// this replica's instance name was written by another process since its
// own last announcement: two replicas share an instance_id (one config
// file for every replica, instance_id set in it). Nothing runs twice for
// it (a claim is its token's), but the two are one member to the fleet
// (shares, scheduler_replicas), one's leave withdraws the other, and logs
// and history cannot tell them apart. Read before this announcement: the
// twin's entry, written once a tick, is the latest between two of ours.
// A crashed predecessor's entry is overwritten by the first announcement,
// long before the first check.
func (r *Runner) checkTwin(ctx context.Context) {
	ms, err := r.opts.Controls.Announcements(ctx)
	if err != nil {
		return
	}
	for _, m := range ms {
		if m.Instance != r.opts.Instance || m.Incarnation == "" || m.Incarnation == r.opts.Controls.Incarnation() {
			continue
		}
		r.mu.Lock()
		due := r.twinWarned.IsZero() || time.Since(r.twinWarned) > twinWarnEvery
		if due {
			r.twinWarned = time.Now()
		}
		r.mu.Unlock()
		if due {
			r.log.ErrorContext(ctx, "another process announces itself under this instance_id; give each replica its own",
				"instance", r.opts.Instance, "incarnation", r.opts.Controls.Incarnation(), "other_incarnation", m.Incarnation,
				"other_at", m.At.Format(time.RFC3339Nano))
		}
	}
}

// twinWarnEvery bounds how often checkTwin repeats its warning.
const twinWarnEvery = 10 * time.Minute

// leave withdraws this replica's announcement as Run stops (ctx is done),
// bounded by a third of the lease: the others stop holding back for its
// runs at their next read. A replica that crashes does not leave; its
// entry expires after memberTTL.
func (r *Runner) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.Lease/3)
	defer cancel()
	_ = r.opts.Controls.Leave(ctx, r.opts.Instance)
}

// setMembers installs the replicas read up, this one added if its own
// announcement is not among them yet.
func (r *Runner) setMembers(ms []string) {
	if !slices.Contains(ms, r.opts.Instance) {
		ms = append(slices.Clone(ms), r.opts.Instance)
		slices.Sort(ms)
	}
	r.view.Store(&membership{members: ms, read: time.Now()})
	r.opts.Metrics.replicasSeen(len(ms))
}

// holdOf is how long this replica holds back its first bid for the run
// with id runID, past the run's start, among runs dispatched with spread
// (see Options.Spread). With a view of two or more replicas read within
// memberTTL, the run's owner (the member with the least holdFor) holds
// nothing and the others between the spread and one and a half times it;
// without one, every replica holds holdFor, and the owner usually wins
// all the same, only later. The others hold past the spread, not within
// it, so that their bids mostly find the run done rather than still held:
// a held run is watched, by a goroutine and a bid every RenewEvery, until
// it is done.
func (r *Runner) holdOf(runID string, spread time.Duration) time.Duration {
	mine := holdFor(runID, r.opts.Instance, spread)
	v := r.view.Load()
	if spread <= 0 || v == nil || len(v.members) < 2 || time.Since(v.read) > r.memberTTL() {
		return mine
	}
	for _, m := range v.members {
		if m != r.opts.Instance && holdFor(runID, m, spread) < mine {
			return spread + mine/2
		}
	}
	return 0
}
