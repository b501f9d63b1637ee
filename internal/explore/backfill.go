package explore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/nemesis"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
)

// backfillPlan is one backfill the operator runs: `scheduler backfill`
// in a replica's pod (kubectl exec), so it shares that replica's link and
// host faults and dies with it. Run again until it settles every instant,
// as an operator would after a killed or failed one: the second run must
// resume what the first left live (runner.ActionResume).
type backfillPlan struct {
	at      time.Duration // when it starts, from t0
	replica int
	job     string
	// from and to are from t0 too: from may be before it (instants no
	// replica ran, so the backfill has work), to is past at the start.
	from, to   time.Duration
	rerun      string
	concurrent int
	// once: the operator runs it once and gives up, whatever becomes of
	// it, and its range lies behind a prehistory of ended runs of its job
	// (deeper than the sweep reads): a run it leaves is the fleet's to
	// take over, or nobody's.
	once bool
}

// drawBackfills draws the seed's backfills from a stream of their own,
// so the nemesis plan and the other operator actions stay those the
// seed drew before backfills were explored. One seed in two has one;
// half of those start shortly before a fault of their replica's (a
// crash, a termination, a pause, a partition), so that the faults meet
// a backfill at work.
func (w *world) drawBackfills() []backfillPlan {
	if w.cfg.Plan != nil || w.cfg.NoBackfills {
		return nil // a pinned plan replays the history it pinned
	}
	rng := rand.New(rand.NewPCG(w.cfg.Seed, 0xbf))
	if rng.IntN(2) == 0 {
		return nil
	}
	l := w.cfg.Lease
	b := backfillPlan{at: l + time.Duration(rng.Int64N(int64(max(w.cfg.Faults-l, time.Second)))),
		replica: rng.IntN(w.cfg.Replicas), job: w.jobs[rng.IntN(len(w.jobs))].name,
		rerun: []string{runner.RerunNone, runner.RerunFailed}[rng.IntN(2)], concurrent: 1 + rng.IntN(3)}
	if hits := w.podFaults(); len(hits) > 0 && rng.IntN(2) == 0 {
		op := hits[rng.IntN(len(hits))]
		b.replica, b.at = op.Replica, op.At-time.Duration(rng.Int64N(int64(l/2)))
	}
	// Up to 8s of instants, ending 2s before t0 at the earliest and 3s
	// before the start at the latest (a replica's clock may be stepped
	// back; the backfill refuses a range reaching into its future, and is
	// tried again).
	b.to = -2*time.Second + time.Duration(rng.Int64N(int64(b.at-time.Second)))
	b.from = b.to - 2*time.Second - time.Duration(rng.Int64N(int64(6*time.Second)))
	// From a stream of its own, so the draws above stay those seeds drew
	// before given-up backfills were explored.
	b.once = !w.cfg.NoOnce && rand.New(rand.NewPCG(w.cfg.Seed, 0xbf1)).IntN(2) == 0
	return []backfillPlan{b}
}

// prehistoryRuns is how many ended runs of its job a given-up backfill's
// range lies behind: more than the sweep's first read of a history
// (runner's recoverProbe, 16), none of them skipped or missed, so it
// reads no deeper.
const prehistoryRuns = 20

// prehistory records, before any replica starts, the latest
// prehistoryRuns instants of b's job before t0 as run and succeeded, by
// a fleet of the past, and moves b's range behind them: the job has run
// for a while, and the operator backfills older instants.
func (w *world) prehistory(b *backfillPlan) error {
	var sched *schedule.Schedule
	for i, j := range w.jobs {
		if j.name == b.job {
			sched = w.scheds[i]
		}
	}
	var ats []time.Time
	for at := sched.Next(w.t0.Add(-time.Hour)); at.Before(w.t0.Add(-time.Second)); at = sched.Next(at) {
		ats = append(ats, at)
	}
	ats = ats[max(0, len(ats)-prehistoryRuns):]
	if shift := w.t0.Add(b.to).Sub(ats[0].Add(-time.Second)); shift > 0 {
		b.to -= shift
		b.from -= shift
	}
	c, err := w.cfg.Open("past")
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Set-up, before any fault: a backend that does not answer in time
	// (servers just started on a loaded machine: a Redlock quorum not
	// reached in CI) is asked again, within the minute. A bid that met
	// its own partial grant meets ErrHeld until that lease ends.
	again := func(err error) bool {
		if !errors.Is(err, claim.ErrUnavailable) && !errors.Is(err, claim.ErrHeld) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
			return true
		}
	}
	for _, at := range ats {
		run := claim.Run{Job: b.job, At: at}
		cl, err := claim.ClaimOne(ctx, c, run, w.cfg.Lease)
		for err != nil && again(err) {
			cl, err = claim.ClaimOne(ctx, c, run, w.cfg.Lease)
		}
		if err != nil {
			return fmt.Errorf("prehistory %s: %w", run.ID(), err)
		}
		err = c.Release(ctx, []*claim.Claim{cl}, []claim.Status{claim.Succeeded})[0]
		for err != nil && again(err) {
			err = c.Release(ctx, []*claim.Claim{cl}, []claim.Status{claim.Succeeded})[0]
		}
		if err != nil {
			return fmt.Errorf("prehistory %s: %w", cl.ID(), err)
		}
	}
	return nil
}

// runBackfill runs b until one run of it settles every instant (no
// error, none interrupted) or ctx (the history's) ends. Each run is named
// for the process it is (b1, b2, … on replica rN), so the checker tells
// its runs, which ignore the overlap policy by design, from the fleet's.
func (w *world) runBackfill(ctx context.Context, b backfillPlan) {
	if !sleepUntil(ctx, w.t0.Add(b.at)) {
		return
	}
	r := w.reps[b.replica]
	from, to := w.t0.Add(b.from).Truncate(time.Second), w.t0.Add(b.to).Truncate(time.Second)
	for try := 1; ctx.Err() == nil; try++ {
		name := fmt.Sprintf("%s.backfill%d", r.id, try)
		sum, err, ok := r.backfill(ctx, name, b, from, to)
		note := fmt.Sprintf("operator: backfill %s from %.1fs to %.1fs (rerun %s, %d at once) on %s: %d planned, %d succeeded, %d failed, %d interrupted, %d elsewhere, %d errors",
			b.job, from.Sub(w.t0).Seconds(), to.Sub(w.t0).Seconds(), b.rerun, b.concurrent, name,
			sum.Planned, sum.Succeeded, sum.Failed, sum.Interrupted, sum.Elsewhere, sum.Errors)
		if err != nil {
			note += ": " + err.Error()
		}
		w.log.Add(history.Event{Kind: history.Fault, Note: note})
		if b.once {
			// Given up: the runs it left are the fleet's (abandoned, else).
			w.log.Add(history.Event{Kind: history.Fault, Note: "operator: gives the backfill up"})
			w.mu.Lock()
			w.backfillsDone++
			if !ok || err != nil || sum.Errors > 0 || sum.Interrupted > 0 {
				w.backfillsLeft++
			}
			w.mu.Unlock()
			return
		}
		if ok && err == nil && sum.Errors == 0 && sum.Interrupted == 0 {
			w.mu.Lock()
			w.backfillsDone++
			w.mu.Unlock()
			return
		}
		if !sleepUntil(ctx, time.Now().Add(w.cfg.Lease/3)) {
			return
		}
	}
}

// backfill runs one backfill process named name on r's host (inPod);
// ok is false if r crashed or stopped under it.
func (r *replica) backfill(ctx context.Context, name string, b backfillPlan, from, to time.Time) (sum runner.BackfillSummary, err error, ok bool) {
	r.w.noteBackfill(name)
	ok, err = r.inPod(ctx, name, func(rctx context.Context, run *runner.Runner, _ func()) error {
		var err error
		_, sum, err = run.Backfill(rctx, b.job, runner.BackfillOptions{From: from, To: to, Rerun: b.rerun, MaxConcurrent: b.concurrent})
		return err
	})
	return sum, err, ok
}

// podFaults are the plan's faults of one replica that a process in its
// pod meets (a crash, a termination, a pause, a partition), from a lease
// and a half on: a backfill or a trigger drawn to start just before one.
func (w *world) podFaults() []nemesis.Op {
	l := w.cfg.Lease
	var hits []nemesis.Op
	for _, op := range w.plan.Ops {
		if op.Replica >= 0 && contains([]string{nemesis.Crash, nemesis.Term, nemesis.Pause, nemesis.Partition, nemesis.OneWay}, op.Kind) &&
			op.At > l+l/2 {
			hits = append(hits, op)
		}
	}
	return hits
}

// noteBackfill records name as a backfill process, for the checker.
func (w *world) noteBackfill(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.backfillNames == nil {
		w.backfillNames = map[string]bool{}
	}
	w.backfillNames[name] = true
}
