package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
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
	"github.com/scheduler-dev/scheduler/job"
)

// An outage far longer than the recorded-missed cap (an @every 1s job
// down for 5h: 18,000 instants) still catches up the newest max_catchup
// instants, oldest first, and records the cap's worth before them missed.
func TestCatchUpAfterAnOutageLongerThanTheMissedCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		jobs := []runner.Job{{Name: "often", Schedule: mustSchedule(t, "@every 1s"), Misfire: runner.MisfireRunAll,
			MaxCatchup: 3, Grace: time.Hour, Handler: func(ctx context.Context, run job.Run) error { return nil }}}
		rs := startReplicas(t, store, led, jobs, "a")
		// Stopped between instants: stopped on one, the instant's
		// grant could come back as the bid gave up, be handed back
		// interrupted, and be taken over at the restart beside the
		// catch-up.
		time.Sleep(3500 * time.Millisecond)
		stopAll(rs)
		time.Sleep(5 * time.Hour)
		up := time.Now()
		rs = startReplicas(t, store, led, jobs, "a", "b", "c")
		time.Sleep(5 * time.Second)
		stopAll(rs)

		var caught []time.Time
		for _, x := range led.events(history.Start) {
			for _, s := range x {
				if !s.Run.At.After(up) && !s.At.Before(up) {
					caught = append(caught, s.Run.At)
				}
			}
		}
		slices.SortFunc(caught, time.Time.Compare)
		want := []time.Time{up.Truncate(time.Second).Add(-2 * time.Second), up.Truncate(time.Second).Add(-time.Second), up.Truncate(time.Second)}
		if len(caught) != 3 || !caught[0].Equal(want[0].UTC()) || !caught[2].Equal(want[2].UTC()) {
			t.Errorf("caught up %v, want the newest 3 instants before the restart %v", caught, want)
		}
		sts := statuses(t, store, "often")
		// Right before the ones caught up, none is left unrecorded.
		for at := want[0].Add(-100 * time.Second).UTC(); at.Before(want[0]); at = at.Add(time.Second) {
			if sts[at] != claim.Missed {
				t.Errorf("%s: %q, want recorded missed", at.Format(time.TimeOnly), sts[at])
			}
		}
		missed := 0
		for _, st := range sts {
			if st == claim.Missed {
				missed++
			}
		}
		// Each replica that starts records up to 10,000 before the
		// newest record it read, so three may record a few thousand more.
		if missed < 10_000 || missed > 3*10_000 {
			t.Errorf("%d instants recorded missed, want from the cap, 10,000, to three times it", missed)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"often": true}})
	})
}

// ghostHistory reports one run live that the backend does not hold, as
// Redlock's History does for a failed bid's leftovers (copies a minority
// still holds, reported at their widest): start-up recovery finds it live,
// but its claim comes back as attempt 1.
type ghostHistory struct {
	claim.Claimer
	ghost  claim.Record
	served atomic.Int32
}

func (g *ghostHistory) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	recs, err := g.Claimer.History(ctx, job, limit)
	if err != nil || job != g.ghost.Job {
		return recs, err
	}
	i, _ := slices.BinarySearchFunc(recs, g.ghost.At, func(r claim.Record, at time.Time) int { return at.Compare(r.At) })
	recs = slices.Insert(recs, i, g.ghost)
	if limit > 0 && len(recs) > limit {
		recs = recs[:limit]
	}
	g.served.Add(1)
	return recs, nil
}

// A run start-up recovery finds live but wins as attempt 1 was never
// started: it is an instant missed while no replica was up, and under
// run-all runs only if it is among the newest max_catchup. An older one
// is recorded missed, as the catch-up would have recorded it, not run
// because it lies within the grace (seen once with Redlock across replica
// processes: an instant run that should have been recorded missed).
func TestRecoveredRunWonAsAttemptOneFollowsTheMisfirePolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		jobs := []runner.Job{{Name: "often", Schedule: mustSchedule(t, "@every 1s"), Misfire: runner.MisfireRunAll,
			MaxCatchup: 2, Grace: time.Hour, Handler: func(ctx context.Context, run job.Run) error { return nil }}}
		rs := startReplicas(t, store, led, jobs, "a")
		// Stopped between instants: stopped on one, the instant's
		// grant could come back as the bid gave up, be handed back
		// interrupted, and be taken over at the restart beside the
		// catch-up.
		time.Sleep(3500 * time.Millisecond)
		stopAll(rs)
		time.Sleep(time.Minute)
		up := time.Now()
		at := up.Truncate(time.Second).Add(-30 * time.Second).UTC()
		g := &ghostHistory{ghost: claim.Record{RunID: claim.Run{Job: "often", At: at}.ID(), Job: "often", At: at,
			Status: claim.Running, Holder: "ghost", Fence: 1, Attempt: 1, StartedAt: at, LeaseUntil: at.Add(3 * time.Second)}}
		rp := &replica{name: "b", store: store, jobs: jobs, led: led,
			wrap: func(c claim.Claimer) claim.Claimer { g.Claimer = c; return g }}
		rp.start(t)
		time.Sleep(5 * time.Second)
		rp.stop()

		if g.served.Load() == 0 {
			t.Fatal("the ghost was never read: the test shows nothing")
		}
		id := claim.Run{Job: "often", At: at}.ID()
		if n := len(led.starts(id)); n != 0 {
			t.Errorf("%s, older than the instants caught up, ran %d times", id, n)
		}
		if st := statuses(t, store, "often")[at]; st != claim.Missed {
			t.Errorf("%s: %q, want recorded missed", id, st)
		}
		led.check(t, history.Spec{Forbid: map[string]bool{"often": true}})
	})
}

// Jobs due together that share a spec but not a zone keep their own next
// instants: the loop finds the next instant once per spec, zone and
// instant, not once per spec. "0 0,30,40 * * * *" fires at :00 and :30 UTC
// in both zones below (Kolkata is UTC+5:30), but after :00 the UTC job's
// next is :30 and the Kolkata job's :10 (its :40).
func TestJobsSharingASpecAcrossZonesKeepTheirOwnInstants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		var jobs []runner.Job
		for i, tz := range []string{"UTC", "Asia/Kolkata", "UTC", "Asia/Kolkata"} {
			s, err := schedule.Parse("0 0,30,40 * * * *", tz)
			if err != nil {
				t.Fatal(err)
			}
			jobs = append(jobs, runner.Job{Name: fmt.Sprintf("%s.%d", tz, i), Schedule: s,
				Handler: func(context.Context, job.Run) error { return nil }})
		}
		start := time.Date(2000, 1, 1, 0, 59, 0, 0, time.UTC)
		time.Sleep(time.Until(start))
		rs := startReplicas(t, store, led, jobs, "a", "b")
		time.Sleep(42 * time.Minute) // to 01:41
		stopAll(rs)

		hm := func(h, m int) time.Time { return time.Date(2000, 1, 1, h, m, 0, 0, time.UTC) }
		want := map[string][]time.Time{
			"UTC":          {hm(1, 0), hm(1, 30), hm(1, 40)},
			"Asia/Kolkata": {hm(1, 0), hm(1, 10), hm(1, 30)},
		}
		for _, j := range jobs {
			var ran []time.Time
			for at, st := range statuses(t, store, j.Name) {
				if at.Before(start) {
					continue // the look-back at start-up, recorded missed
				}
				if st != claim.Succeeded {
					t.Errorf("%s at %s: %s, want succeeded", j.Name, at.Format(time.TimeOnly), st)
				}
				ran = append(ran, at)
			}
			slices.SortFunc(ran, time.Time.Compare)
			if w := want[j.Schedule.Location().String()]; !slices.Equal(ran, w) {
				t.Errorf("%s ran at %v, want %v", j.Name, ran, w)
			}
		}
		led.check(t, history.Spec{})
	})
}

// Runs due together on time cost no goroutine each while they are held
// back and bid for: one goroutine sends their first bids as their holds
// pass, and a run gets a goroutine of its own only once it is won or must
// stand by. Midway through the hold window of 1,000 runs due at once, the
// replica runs a handful more goroutines than at idle, not hundreds.
func TestRunsDueTogetherAreHeldWithoutAGoroutineEach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		led := newLedger()
		const n = 1000
		jobs := make([]runner.Job, n)
		for i := range jobs {
			jobs[i] = runner.Job{Name: fmt.Sprintf("hourly.%04d", i), Schedule: mustSchedule(t, "0 0 * * * *"),
				Handler: func(context.Context, job.Run) error { return nil }}
		}
		instant := time.Date(2000, 1, 1, 1, 0, 0, 0, time.UTC)
		time.Sleep(time.Until(instant.Add(-time.Second)))
		rs := startReplicas(t, store, led, jobs, "a")
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		idle := runtime.NumGoroutine()
		// The spread of 1,000 runs due at once is 100ms (Options.Spread):
		// halfway through it, about half have been bid for and run.
		time.Sleep(time.Until(instant.Add(50 * time.Millisecond)))
		synctest.Wait()
		if busy := runtime.NumGoroutine(); busy-idle > 20 {
			t.Errorf("%d goroutines midway through the hold window, %d at idle: want a handful more, not one per run", busy, idle)
		}
		time.Sleep(time.Second)
		stopAll(rs)
		ran := 0
		for _, j := range jobs {
			if st := statuses(t, store, j.Name)[instant]; st == claim.Succeeded {
				ran++
			}
		}
		if ran != n {
			t.Errorf("%d of %d runs succeeded", ran, n)
		}
		led.check(t, history.Spec{})
	})
}

// TestAScheduleWithNoFurtherInstantLeavesTheLoop: a schedule can run out
// of instants (@every past what a Duration since the epoch holds; a cron
// spec with none in the five years its library searches). Its last
// instant runs once; then the job leaves the loop with a warning, instead
// of coming due at once forever as a zero instant would, recorded missed
// again and again.
func TestAScheduleWithNoFurtherInstantLeavesTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs, logger, _, _ := observed(slog.LevelInfo)
		// A clock 24 s before the last @every 10s instant there is:
		// 2262-04-11 23:47:10 UTC.
		last := time.Unix(0, math.MaxInt64).Truncate(10 * time.Second)
		offset := time.Until(last.Add(-24 * time.Second))
		ctx, cancel := context.WithCancel(t.Context())
		// The runner reads the clock every pass of its loop: a loop that
		// spins reads it without end, and fake time never moves on.
		var reads atomic.Int64
		now := func() time.Time { // the backend's clock too
			if reads.Add(1) == 100_000 {
				cancel()
			}
			return time.Now().Add(offset)
		}
		led := newLedger()
		var events atomic.Int32
		observe := led.observer("a")
		r, err := runner.New(runner.Options{Claimer: led.claimer("a", memory.New(memory.NewStore(now), "a")), ClaimerName: "memory",
			Instance: "a", Lease: 3 * time.Second, Logger: logger, Now: now,
			Observe: func(e runner.Event) {
				observe(e)
				if events.Add(1) > 20 {
					cancel() // the loop spins: stop it, and fail below
				}
			}},
			[]runner.Job{{Name: "last.instants", Schedule: mustSchedule(t, "@every 10s"),
				Handler: func(context.Context, job.Run) error { return nil }}})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = r.Run(ctx); close(done) }()
		select {
		case <-time.After(time.Minute):
		case <-ctx.Done():
		}
		cancel()
		<-done
		if n := reads.Load(); n >= 100_000 {
			t.Fatalf("the loop read the clock %d times in a minute: it spins", n)
		}
		var ran []time.Time
		for _, s := range led.started() {
			if s[0].Run.At.After(last.Add(-24 * time.Second)) { // not the instant before start-up
				ran = append(ran, s[0].Run.At)
			}
		}
		slices.SortFunc(ran, time.Time.Compare)
		if want := []time.Time{last.Add(-20 * time.Second), last.Add(-10 * time.Second), last}; !slices.EqualFunc(ran, want, time.Time.Equal) {
			t.Fatalf("runs started at %v, want the last three instants %v (%d events)", ran, want, events.Load())
		}
		if n := strings.Count(logs.String(), `"msg":"schedule exhausted"`); n != 1 {
			t.Fatalf("%d schedule exhausted warnings, want 1:\n%s", n, logs)
		}
	})
}

// A replica that starts finds a live run behind more than a page of the
// instants it held back: a long run of a forbid job whose holder died
// after twenty later instants were recorded skipped, while this replica
// was down, is taken over and run, not left live for good, nor skipped
// behind the look-back instant: the look-back is dispatched only once
// the live run is watched, so it sees the run and stands by for it (it
// started before its takeover was granted in 1 run in 5 under -race, and
// the takeover yielded to it: a run that started, lost to a crash).
// Repeated, since goroutines' order decided it.
func TestStartUpFindsALiveRunBehindTheInstantsItHeldBack(t *testing.T) {
	for i := range 20 {
		t.Run(fmt.Sprint(i), testStartUpFindsALiveRunBehindTheInstantsItHeldBack)
	}
}

func testStartUpFindsALiveRunBehindTheInstantsItHeldBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		ctx := context.Background()
		start := time.Now().UTC().Truncate(time.Minute).Add(time.Minute)
		time.Sleep(time.Until(start.Add(500 * time.Millisecond)))
		long := claim.Run{Job: "sec", At: start}
		dead := memory.New(store, "dead")
		if _, err := claim.ClaimOne(ctx, dead, long, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		other := memory.New(store, "other")
		for i := 1; i <= 20; i++ {
			cl, err := claim.ClaimOne(ctx, other, claim.Run{Job: "sec", At: start.Add(time.Duration(i) * time.Second)}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := claim.ReleaseOne(ctx, other, cl, claim.Skipped); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Until(start.Add(21*time.Second + 500*time.Millisecond))) // the holder's lease has lapsed
		var mu sync.Mutex
		ran := map[time.Time]int{}
		jobs := []runner.Job{{Name: "sec", Schedule: mustSchedule(t, "* * * * * *"),
			Handler: func(ctx context.Context, run job.Run) error {
				mu.Lock()
				ran[run.ScheduledAt.UTC()]++
				mu.Unlock()
				return nil
			}}}
		rs := startReplicas(t, store, newLedger(), jobs, "b")
		time.Sleep(10 * time.Second)
		stopAll(rs)
		mu.Lock()
		defer mu.Unlock()
		if n := ran[start]; n != 1 {
			t.Fatalf("the live run at %s ran %d times after start-up, want once (taken over)", start.Format(time.TimeOnly), n)
		}
		if st := statuses(t, store, "sec")[start]; st != claim.Succeeded {
			t.Fatalf("the live run ended %q, want succeeded", st)
		}
	})
}

// A replica whose loop falls behind past the late tolerance (its process
// stopped or starved, or, as here, its clock jumped ahead) dispatches the
// latest instant under the misfire policy and records every one it fell
// behind on missed (fell_behind): with no other replica up, nothing else
// ever would. (An outside review stopped the only replica for 20s: six
// instants were left with no record, no log line and no metric.) A paused
// job misses nothing, as at start-up.
func TestInstantsALoopFellBehindOnAreRecordedMissed(t *testing.T) {
	for _, paused := range []bool{false, true} {
		t.Run(fmt.Sprintf("paused=%v", paused), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { fallBehind(t, paused) })
		})
	}
}

func fallBehind(t *testing.T, paused bool) {
	// The store's clock jumps with the replica's, as for a process
	// stopped and resumed: no one else's time passes differently.
	var jump atomic.Int64
	store := memory.NewStore(func() time.Time { return time.Now().Add(time.Duration(jump.Load())) })
	led := newLedger()
	reg := prometheus.NewRegistry()
	metrics := runner.NewMetrics(reg)
	jobs := []runner.Job{{Name: "tick", Schedule: mustSchedule(t, "@every 3s"),
		Handler: func(ctx context.Context, run job.Run) error { return nil }}}
	rp := &replica{name: "a", store: store, jobs: jobs, led: led, jump: &jump, metrics: metrics}
	rp.start(t)
	time.Sleep(10 * time.Second)
	if paused {
		if _, err := control.New(store.Controls(), nil).SetPause(context.Background(), control.Pause{Job: "tick", Paused: true, By: "test"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // a control tick
	}
	jump.Store(int64(30 * time.Second))
	time.Sleep(10 * time.Second)
	rp.stop()

	sts := statuses(t, store, "tick")
	var ats []time.Time
	for at := range sts {
		ats = append(ats, at)
	}
	slices.SortFunc(ats, time.Time.Compare)
	missed := 0
	for at := ats[0]; !at.After(ats[len(ats)-1]); at = at.Add(3 * time.Second) {
		switch sts[at] {
		case claim.Missed:
			missed++
		case claim.Succeeded, claim.Skipped: // the instants still on time went at once: under forbid, some overlap
		case "":
			if !paused {
				t.Errorf("%s: no record, want one: succeeded, skipped or missed", at.Format(time.TimeOnly))
			}
		default:
			t.Errorf("%s: %q, want succeeded, skipped or missed", at.Format(time.TimeOnly), sts[at])
		}
	}
	// The jump of 30s skipped ten instants; those still within the
	// late tolerance ran, the rest are missed, but for a paused job.
	if min, max := 7, 10; paused && missed != 0 || !paused && (missed < min || missed > max) {
		t.Errorf("%d instants recorded missed (paused: %v), want %d to %d, none if paused (statuses %v)", missed, paused, min, max, sts)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "scheduler_runs_missed_total" {
			for _, m := range mf.GetMetric() {
				counted[label(m, "reason")] += m.GetCounter().GetValue()
			}
		}
	}
	if int(counted[runner.MissedBehind]) != missed || len(counted) > 1 {
		t.Errorf("scheduler_runs_missed_total by reason: %v, want %d fell_behind", counted, missed)
	}
	led.check(t, history.Spec{})
}

// slowMissedRelease delays every release batch that records a run missed,
// as a backend a round trip away does: the claims taken only to record
// the outage's instants missed stay live meanwhile.
type slowMissedRelease struct{ claim.Claimer }

func (s slowMissedRelease) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	if slices.Contains(outs, claim.Missed) {
		time.Sleep(300 * time.Millisecond)
	}
	return s.Claimer.Release(ctx, cls, outs)
}

// Replicas that start after an outage run the instants still within the
// late tolerance, while the outage's older instants are being recorded
// missed: the claims taken only to record those are no earlier run for
// the overlap policy (forbid). An outside review restarted a replica after
// 25s down: the two instants still on time were skipped as overlap with
// the claims recording the ones before them, and nothing ran. One replica,
// and two starting together (each one's probe meets the other's claims).
func TestInstantsStillOnTimeAtStartUpRunWhileTheOutageIsRecorded(t *testing.T) {
	for _, overlap := range []string{runner.OverlapForbid, runner.OverlapBufferOne, runner.OverlapReplace} {
		for _, names := range [][]string{{"a"}, {"b", "c"}} {
			t.Run(overlap+"/"+strings.Join(names, ","), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { startAfterAnOutage(t, overlap, names) })
			})
		}
	}
}

func startAfterAnOutage(t *testing.T, overlap string, names []string) {
	store := memory.NewStore(nil)
	led := newLedger()
	jobs := []runner.Job{{Name: "tick", Schedule: mustSchedule(t, "*/3 * * * * *"), Overlap: overlap,
		Handler: func(ctx context.Context, run job.Run) error { return nil }}}
	time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute + 500*time.Millisecond)))
	first := startReplicas(t, store, led, jobs, "a")
	time.Sleep(10 * time.Second)
	stopAll(first)
	down := time.Now()
	time.Sleep(25 * time.Second)
	up := time.Now()
	var back []*replica
	for _, n := range names {
		rp := &replica{name: n, store: store, jobs: jobs, led: led,
			wrap: func(c claim.Claimer) claim.Claimer { return slowMissedRelease{c} }}
		rp.start(t)
		back = append(back, rp)
	}
	time.Sleep(9 * time.Second)
	stopAll(back)
	// The late tolerance is 2×1s skew + 5s = 7s: at the start, two
	// instants are still on time and the six before them are not. The
	// earliest on time runs (under replace, it or a later one that
	// replaced it); the next ones, due while it waited for the outage's
	// claims to be released, may be skipped for it; the rest run.
	sts := statuses(t, store, "tick")
	var ats []time.Time
	for at := range sts {
		ats = append(ats, at)
	}
	slices.SortFunc(ats, time.Time.Compare)
	firstOnTime, missed, ran, atStart := true, 0, 0, 0
	for _, at := range ats {
		st := sts[at]
		switch late := up.Sub(at); {
		case late > 8*time.Second && at.After(down):
			missed++
			if st != claim.Missed {
				t.Errorf("%s (%v before the start): %s, want missed", at.Format(time.TimeOnly), late, st)
			}
		case late < 6*time.Second && late > 0 && firstOnTime && overlap != runner.OverlapReplace,
			late < -2*time.Second && at.Before(up.Add(8*time.Second)):
			firstOnTime = false
			ran++
			if st != claim.Succeeded {
				t.Errorf("%s (%v before the start): %s, want succeeded", at.Format(time.TimeOnly), late, st)
			}
		case late < 6*time.Second && late > 0, late <= 0 && late >= -2*time.Second:
			firstOnTime = false
			if st == claim.Succeeded {
				atStart++
			}
			if st != claim.Succeeded && st != claim.Skipped {
				t.Errorf("%s (%v before the start): %s, want succeeded or skipped", at.Format(time.TimeOnly), late, st)
			}
		}
	}
	if overlap == runner.OverlapReplace && atStart == 0 {
		t.Errorf("none of the instants on time at the start ran: %v", sts)
	}
	if missed != 6 || ran < 2 {
		t.Errorf("%d instants missed and %d checked to have run, want 6 and at least 2: %v", missed, ran, sts)
	}
	led.check(t, history.Spec{})
}
