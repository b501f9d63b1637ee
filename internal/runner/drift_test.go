package runner_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
	"github.com/scheduler-dev/scheduler/job"
)

// version is one version of the drift tests' job "tick": what a config
// change during a rolling deploy changes.
type version struct {
	spec, tz string
	jitter   time.Duration
}

func (v version) String() string {
	return fmt.Sprintf("%q in %s, jitter %v", v.spec, cmp.Or(v.tz, "UTC"), v.jitter)
}

func (v version) job(t *testing.T) runner.Job {
	t.Helper()
	s, err := schedule.Parse(v.spec, v.tz)
	if err != nil {
		t.Fatal(err)
	}
	return runner.Job{Name: "tick", Schedule: s, Jitter: v.jitter,
		Handler: func(ctx context.Context, run job.Run) error { return nil }}
}

// drifting is a replica running one version of "tick", with its warnings
// logged as JSON and its metrics on a registry of its own.
type drifting struct {
	name   string
	job    runner.Job
	logs   *testenv.Logs
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
}

// driftOptions are the runner options the drift tests vary.
type driftOptions struct {
	lease, controlEvery time.Duration
	// overlap, if set, is the job's overlap policy (default forbid).
	overlap string
}

func startDrifting(t *testing.T, name string, v version, c claim.Claimer, ctl claim.Controls, led *ledger, o driftOptions) *drifting {
	t.Helper()
	logs, logger, reg, metrics := observed(slog.LevelWarn)
	rp := &drifting{name: name, job: v.job(t), logs: logs, reg: reg, done: make(chan struct{})}
	if o.overlap != "" {
		rp.job.Overlap = o.overlap
	}
	r, err := runner.New(runner.Options{Claimer: led.claimer(name, c), ClaimerName: "test", Instance: name,
		Lease: o.lease, MaxClockSkew: 500 * time.Millisecond, ShutdownGrace: 5 * time.Second,
		Logger: logger, Metrics: metrics, Observe: led.observer(name),
		Controls: control.New(ctl, nil), ControlEvery: o.controlEvery}, []runner.Job{rp.job})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp.cancel = cancel
	go func() { defer close(rp.done); _ = r.Run(ctx) }()
	return rp
}

func (rp *drifting) stop() { rp.cancel(); <-rp.done }

// conflicts returns the replica's `schedule conflict` lines.
func (rp *drifting) conflicts() []map[string]any {
	var out []map[string]any
	for _, l := range rp.logs.JSONLines() {
		if l["msg"] == "schedule conflict" {
			out = append(out, l)
		}
	}
	return out
}

// counted is the replica's scheduler_schedule_conflicts_total{job="tick"}.
func (rp *drifting) counted(t *testing.T) float64 {
	t.Helper()
	mfs, err := rp.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "scheduler_schedule_conflicts_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "job" && l.GetValue() == "tick" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// checkConflicts checks that rp logged want conflicts (-1: at most one),
// each naming other's version and writer, and counted as many.
func (rp *drifting) checkConflicts(t *testing.T, want int, other *drifting) {
	t.Helper()
	got := rp.conflicts()
	switch {
	case want >= 0 && len(got) != want:
		t.Errorf("%s logged %d schedule conflicts, want %d: %v", rp.name, len(got), want, got)
	case len(got) > 1:
		t.Errorf("%s logged %d schedule conflicts, want at most 1: %v", rp.name, len(got), got)
	}
	for _, l := range got {
		ours, _ := l["ours"].(map[string]any)
		theirs, _ := l["theirs"].(map[string]any)
		if l["job"] != "tick" || l["instance"] != rp.name || l["by"] != other.name || ours["fingerprint"] != rp.job.Fingerprint() ||
			theirs["fingerprint"] != other.job.Fingerprint() || theirs["spec"] != other.job.Schedule.String() ||
			theirs["timezone"] != other.job.Schedule.Location().String() || theirs["jitter"] != other.job.Jitter.String() {
			t.Errorf("%s: conflict line %v; want ours %s, theirs %s's %s", rp.name, l, rp.job.Fingerprint(), other.name, other.job.Fingerprint())
		}
	}
	if n := rp.counted(t); n != float64(len(got)) {
		t.Errorf("%s: scheduler_schedule_conflicts_total{job=tick} = %v, want %d (one per line logged)", rp.name, n, len(got))
	}
}

// names reports whether one of jobs' schedules names run's instant.
func names(run claim.Run, jobs ...runner.Job) bool {
	for _, j := range jobs {
		if j.Schedule.Next(run.At.Add(-time.Second)).Equal(run.At) {
			return true
		}
	}
	return false
}

// named lists the runs of "tick" in [from, to) that one of jobs'
// schedules names, each once, in order.
func named(from, to time.Time, jobs ...runner.Job) []claim.Run {
	var out []claim.Run
	for at := from.Truncate(time.Second).Add(time.Second); at.Before(to); at = at.Add(time.Second) {
		if run := (claim.Run{Job: "tick", At: at.UTC()}); names(run, jobs...) {
			out = append(out, run)
		}
	}
	return out
}

// ranOnce fails t for each run that did not start exactly once and
// succeed.
//
// An instant whose grant came back past the late tolerance (2×500ms of
// skew + 5s: a machine stalled for seconds) is recorded missed, as the
// product must; that is accepted, and checked against the grant's time.
func ranOnce(t *testing.T, led *ledger, runs []claim.Run) {
	t.Helper()
	const lateTolerance = 2*500*time.Millisecond + 5*time.Second
	for _, run := range runs {
		id := run.ID()
		s := led.starts(id)
		switch {
		case len(s) == 0 && led.missedLate(id, run.At.Add(lateTolerance)):
			t.Logf("%s: missed, granted past the late tolerance (a stalled machine)", id)
		case len(s) != 1:
			t.Errorf("%s started %d times, want once", id, len(s))
			led.explain(t, id)
		default:
			if f := led.finishes(id); len(f) != 1 || f[0].Status != claim.Succeeded {
				t.Errorf("%s finished %+v, want one success", id, f)
				led.explain(t, id)
			}
		}
	}
}

// A rolling deploy changes "tick" from every 2s to every 3s: the old
// version alone, the new one alone, then both at once (a replica left on
// the old config). Each instant either live version names runs once, the
// instants both name (every 6s) once; only the overlap is a conflict,
// logged once by each replica and counted: the old version's entry from
// before the new replica started is not.
func TestScheduleDriftAcrossARollingDeploy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		oldV, newV := version{spec: "*/2 * * * * *"}, version{spec: "*/3 * * * * *"}
		o := driftOptions{lease: 3 * time.Second, controlEvery: time.Second}
		start := func(name string, v version) *drifting {
			return startDrifting(t, name, v, memory.New(store, name), store.Controls(), led, o)
		}
		t0 := time.Now()
		old := start("old", oldV)
		time.Sleep(10 * time.Second)
		old.stop()
		t1 := time.Now()
		nw := start("new", newV)
		time.Sleep(10 * time.Second)
		t2 := time.Now()
		left := start("left-behind", oldV)
		// Each learns of the other's version at a read of the schedule
		// entries, every ScheduleReadEvery ticks: the other's write
		// follows its own read, so two periods and some.
		time.Sleep(3 * runner.ScheduleReadEvery * time.Second)
		nw.stop()
		left.stop()
		end := time.Now()

		old.checkConflicts(t, 0, nw)
		nw.checkConflicts(t, 1, left)
		left.checkConflicts(t, 1, nw)

		both := named(t2.Add(time.Second), end.Add(-2*time.Second), old.job, nw.job)
		ranOnce(t, led, both)
		sixes := 0
		for _, run := range both {
			if run.At.Second()%6 == 0 {
				sixes++
			}
		}
		if sixes < 3 || len(both) < 10 {
			t.Fatalf("checked %d instants, %d named by both versions; want at least 10 and 3", len(both), sixes)
		}
		expected := append(named(t0.Add(time.Second), t1.Add(-time.Second), old.job), named(t1.Add(time.Second), t2.Add(-time.Second), nw.job)...)
		led.check(t, history.Spec{Forbid: map[string]bool{"tick": true}, Expected: append(expected, both...),
			Scheduled: func(r claim.Run) bool { return names(r, old.job, nw.job) }})

		entries, err := control.New(store.Controls(), nil).Schedules(context.Background())
		if e := entries["tick"]; err != nil || (e.Fingerprint != old.job.Fingerprint() && e.Fingerprint != nw.job.Fingerprint()) {
			t.Fatalf("schedule/tick is %+v (%v); want one of the two versions", e, err)
		}
	})
}

// Only a version written while this replica was up is a conflict: the
// entry of one that ran before it started is most likely the config it
// replaced. Each other version is logged and counted once, however often
// it writes.
func TestScheduleConflictNeedsBothVersionsLive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		ctl := control.New(store.Controls(), nil)
		led := newLedger()
		// June 1st: nothing runs here, so nothing here writes the entry.
		rp := startDrifting(t, "new", version{spec: "0 0 1 6 *"}, memory.New(store, "new"), store.Controls(), led,
			driftOptions{lease: 3 * time.Second, controlEvery: time.Second})
		defer rp.stop()
		old := &drifting{name: "old", job: version{spec: "0 0 1 6 *", tz: "Europe/Paris"}.job(t)}
		other := &drifting{name: "other", job: version{spec: "0 0 1 7 *"}.job(t)}
		write := func(d *drifting, at time.Time) {
			t.Helper()
			e := control.ScheduleEntry{Job: "tick", Fingerprint: d.job.Fingerprint(), Spec: d.job.Schedule.String(),
				Timezone: d.job.Schedule.Location().String(), By: d.name, At: at}
			if _, err := ctl.SetSchedule(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			// Past the next read of the schedule entries, at least one
			// tick to spare.
			time.Sleep((runner.ScheduleReadEvery + 2) * time.Second)
		}
		write(old, time.Now().Add(-time.Minute)) // before "new" started
		rp.checkConflicts(t, 0, old)
		write(old, time.Now())
		write(old, time.Now())
		rp.checkConflicts(t, 1, old)
		write(other, time.Now())
		if n := len(rp.conflicts()); n != 2 || rp.counted(t) != 2 {
			t.Errorf("%d conflicts logged and %v counted after a third version, want 2", n, rp.counted(t))
		}
	})
}

// countedControls counts the writes of schedule entries.
type countedControls struct {
	claim.Controls
	writes atomic.Int32
}

func (c *countedControls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	if strings.HasPrefix(e.Key, "schedule/") {
		c.writes.Add(1)
	}
	return c.Controls.Put(ctx, e)
}

// A settled fleet writes a job's schedule entry once an hour, not at
// every run: enough to keep it recent, and off the claim path.
func TestScheduleDriftEntryIsRefreshedHourly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		ctl := &countedControls{Controls: store.Controls()}
		rp := startDrifting(t, "a", version{spec: "@every 10m"}, memory.New(store, "a"), ctl, newLedger(),
			driftOptions{lease: 3 * time.Second, controlEvery: time.Second})
		time.Sleep(3*time.Hour + time.Minute)
		rp.stop()
		entries, err := control.New(store.Controls(), nil).Schedules(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		e := entries["tick"]
		if age := time.Since(e.At); e.Fingerprint != rp.job.Fingerprint() || e.By != "a" || age > time.Hour+10*time.Minute {
			t.Errorf("schedule/tick is %+v, %v old; want a's version, at most an hour and a run old", e, age)
		}
		if n := ctl.writes.Load(); n < 3 || n > 5 {
			t.Errorf("%d writes of schedule/tick in 3h of runs every 10m, want one an hour (4)", n)
		}
		if got := rp.conflicts(); len(got) != 0 {
			t.Errorf("conflicts with itself: %v", got)
		}
	})
}

// TestScheduleDriftOnRealBackends runs two replicas with different
// versions of one job on every claimer's real backend: a different spec,
// time zone, or jitter; a runs alone first, as the old version of a
// rolling deploy. Every instant either version names runs exactly once,
// under its own run id, whatever the jitter; each replica logs and counts
// the conflict once.
func TestScheduleDriftOnRealBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock test: 20s")
	}
	testenv.WallClock(t)
	scenarios := []struct {
		name string
		a, b version
		// wantA, wantB: the conflicts each logs; -1, at most one. Jitter
		// delays a replica's bids, so b, without it, wins nearly every
		// instant: a sees b's entry, but b may not see a's again before
		// the hourly refresh (a version that wins nothing changes
		// nothing either).
		wantA, wantB int
	}{
		{"Spec", version{spec: "*/2 * * * * *"}, version{spec: "*/3 * * * * *"}, 1, 1},
		{"Timezone", version{spec: "* * * * * *"}, version{spec: "* * * * * *", tz: "Asia/Kathmandu"}, 1, 1},
		{"Jitter", version{spec: "* * * * * *", jitter: 300 * time.Millisecond}, version{spec: "* * * * * *"}, 1, -1},
	}
	const span = 16 * time.Second
	// Every subtest sleeps through wall-clock instants, so they all run
	// at once rather than under -parallel's limit.
	var all sync.WaitGroup
	defer all.Wait()
	for _, kind := range backends.Kinds {
		for _, sc := range scenarios {
			all.Go(func() {
				t.Run(kind+"/"+sc.name, func(t *testing.T) {
					open := backends.Open(t, kind)
					led := newLedger()
					// Overlap allow: a claim whose reply comes too late on a
					// loaded machine leaves a ghost, held for a lease, which
					// under forbid would skip the instants after it as
					// overlap; overlap is not what this test is about.
					o := driftOptions{lease: 5 * time.Second, controlEvery: 250 * time.Millisecond, overlap: runner.OverlapAllow}
					start := func(name string, v version) *drifting {
						b := open(name)
						return startDrifting(t, name, v, b.Claimer, b.Controls, led, o)
					}
					begin := time.Now()
					a := start("a", sc.a)
					time.Sleep(2 * time.Second) // a writes its entry alone
					b := start("b", sc.b)
					time.Sleep(span)
					end := time.Now()
					// A lease and a second more before stopping: an instant
					// near the end whose grant was a ghost is taken over and
					// run before shutdown, as it would be by any replica.
					time.Sleep(o.lease + time.Second)
					a.stop()
					b.stop()

					runs := named(begin.Add(3*time.Second), end.Add(-2*time.Second), a.job, b.job)
					ranOnce(t, led, runs)
					if len(runs) < 6 {
						t.Fatalf("checked %d instants, want at least 6", len(runs))
					}
					a.checkConflicts(t, sc.wantA, b)
					b.checkConflicts(t, sc.wantB, a)
					led.check(t, history.Spec{Forbid: map[string]bool{"tick": true}, Expected: runs,
						Scheduled: func(r claim.Run) bool { return names(r, a.job, b.job) }})
					t.Logf("%s %s: %d instants of %s and %s ran once each; conflicts logged: a %d, b %d", kind, sc.name, len(runs),
						sc.a, sc.b, len(a.conflicts()), len(b.conflicts()))
				})
			})
		}
	}
}

// batchControls takes batches of puts (claim.BatchPutter), each a (fake)
// round trip, and counts the requests that carry schedule entries, the
// entries they carry, and the most requests in flight at once.
type batchControls struct {
	claim.Controls
	singles, batches, entries, inFlight, most atomic.Int32
}

func (c *batchControls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	if strings.HasPrefix(e.Key, "schedule/") {
		c.singles.Add(1)
	}
	return c.Controls.Put(ctx, e)
}

func (c *batchControls) PutBatch(ctx context.Context, cs []claim.Control) ([]claim.Control, []error) {
	c.batches.Add(1)
	for _, e := range cs {
		if strings.HasPrefix(e.Key, "schedule/") {
			c.entries.Add(1)
		}
	}
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	time.Sleep(5 * time.Millisecond)
	return claim.PutBatch(ctx, c.Controls, cs)
}

// TestScheduleEntriesOfRunsWonTogetherAreWrittenInAFewBatches: a replica
// that wins hundreds of first runs at one instant owes each job its
// schedule entry, and writes them in a few batches, one at a time (group
// commit), instead of a request each (which would compete with that
// instant's claims and releases for the backend), yet writes every one,
// once.
func TestScheduleEntriesOfRunsWonTogetherAreWrittenInAFewBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		ctl := &batchControls{Controls: store.Controls()}
		var list []runner.Job
		for i := range 200 {
			list = append(list, runner.Job{Name: fmt.Sprintf("j%03d", i), Schedule: mustSchedule(t, "@every 1m"),
				Handler: func(context.Context, job.Run) error { return nil }})
		}
		r, err := runner.New(runner.Options{Claimer: memory.New(store, "a"), ClaimerName: "memory", Instance: "a",
			Lease: 3 * time.Second, Controls: control.New(ctl, nil)}, list)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { _ = r.Run(ctx); close(done) }()
		time.Sleep(90 * time.Second)
		cancel()
		<-done
		// The runs won within the first batch's linger go in it, the rest
		// together behind it.
		if b, s := ctl.batches.Load(), ctl.singles.Load(); b > 3 || s != 0 {
			t.Errorf("%d batches and %d single puts carried the schedule entries, want a few batches and no single put", b, s)
		}
		if m := ctl.most.Load(); m != 1 {
			t.Errorf("%d batches in flight at most, want 1", m)
		}
		if n := ctl.entries.Load(); n != int32(len(list)) {
			t.Errorf("%d schedule entries sent for %d jobs, want each once", n, len(list))
		}
		entries, err := control.New(store.Controls(), nil).Schedules(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != len(list) {
			t.Errorf("%d schedule entries written for %d jobs", len(entries), len(list))
		}
	})
}
