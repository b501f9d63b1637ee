package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/job"
)

// observed is a JSON logger at level into a buffer, and the runner's
// metrics on a fresh registry.
func observed(level slog.Level) (*testenv.Logs, *slog.Logger, *prometheus.Registry, *runner.Metrics) {
	logs := &testenv.Logs{}
	reg := prometheus.NewRegistry()
	return logs, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: level})), reg, runner.NewMetrics(reg)
}

// TestLogAndMetricsContract drives one job through every final status and
// checks every run event's keys (DESIGN.md, "Log events") and the counters'
// values (DESIGN.md, "Metrics").
func TestLogAndMetricsContract(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs, logger, reg, metrics := observed(slog.LevelDebug)
		store := memory.NewStore(nil)
		cut := &failing{Claimer: memory.New(store, "a"), only: "job.lease_lost"}
		handlerLogged := make(chan struct{}, 8)
		// One job per status; each fires once, at the first whole minute.
		handler := func(status string) job.Handler {
			return func(ctx context.Context, run job.Run) error {
				run.Logger.InfoContext(ctx, "handler says hello")
				handlerLogged <- struct{}{}
				switch status {
				case "succeeded":
					return nil
				case "failed":
					return errors.New("boom")
				case "lease_lost":
					cut.down.Store(true)
				}
				<-ctx.Done()
				return context.Cause(ctx)
			}
		}
		var jobs []runner.Job
		for _, st := range []string{"succeeded", "failed", "timeout", "lease_lost", "interrupted"} {
			j := runner.Job{Name: "job." + st, Schedule: mustSchedule(t, "@every 1h"), Handler: handler(st)}
			if st == "timeout" {
				j.Timeout = time.Second
			}
			jobs = append(jobs, j)
		}
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour - time.Second)))
		r, err := runner.New(runner.Options{Claimer: cut, ClaimerName: "memory", Instance: "a",
			Lease: 3 * time.Second, ShutdownGrace: 10 * time.Second, Logger: logger, Metrics: metrics}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		for range jobs {
			<-handlerLogged
		}
		time.Sleep(5 * time.Second) // timeout (1s) and lease loss (3s) play out
		cancel()                    // shutdown: only job.interrupted is still running
		<-done

		at := time.Now().Truncate(time.Hour).UTC()
		want := map[string]string{"job.succeeded": "succeeded", "job.failed": "failed", "job.timeout": "timeout",
			"job.lease_lost": "lease_lost", "job.interrupted": "interrupted"}
		got := map[string]string{}
		for _, l := range logs.JSONLines() {
			msg, _ := l["msg"].(string)
			if msg != "run started" && msg != "run finished" && msg != "run skipped" && msg != "handler says hello" {
				continue
			}
			for _, k := range []string{"job", "scheduled_at", "run_id", "instance", "claimer"} {
				if l[k] == nil || l[k] == "" {
					t.Fatalf("%q lacks %s: %v", msg, k, l)
				}
			}
			if msg != "run skipped" {
				if l["fence"] == nil || l["attempt"] == nil {
					t.Fatalf("%q lacks fence/attempt: %v", msg, l)
				}
			}
			if l["instance"] != "a" || l["claimer"] != "memory" {
				t.Fatalf("wrong identity in %v", l)
			}
			jobName := l["job"].(string)
			if l["scheduled_at"] != at.Format(time.RFC3339) {
				continue // the start-up probe of the previous hour, recorded as a skip
			}
			if l["run_id"] != (claim.Run{Job: jobName, At: at}).ID() {
				t.Fatalf("run_id %v, want %s", l["run_id"], claim.Run{Job: jobName, At: at}.ID())
			}
			if msg == "run finished" {
				if l["duration_ms"] == nil {
					t.Fatalf("run finished lacks duration_ms: %v", l)
				}
				if st := l["status"].(string); st != "succeeded" && l["error"] == nil {
					t.Fatalf("run finished %s lacks error: %v", st, l)
				}
				got[jobName] = l["status"].(string)
			}
		}
		for j, st := range want {
			if got[j] != st {
				t.Errorf("%s finished %q, want %q (all: %v)", j, got[j], st, got)
			}
		}
		expected := `# HELP scheduler_runs_total Runs executed on this replica by final status.
# TYPE scheduler_runs_total counter
scheduler_runs_total{job="job.failed",status="failed"} 1
scheduler_runs_total{job="job.interrupted",status="interrupted"} 1
scheduler_runs_total{job="job.lease_lost",status="lease_lost"} 1
scheduler_runs_total{job="job.succeeded",status="succeeded"} 1
scheduler_runs_total{job="job.timeout",status="timeout"} 1
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(expected), "scheduler_runs_total"); err != nil {
			t.Error(err)
		}
		// Each job: one skip-recorded probe of the previous hour, one won
		// claim for this hour.
		for _, j := range jobs {
			won := testutil.ToFloat64(metrics.ClaimsCounter().WithLabelValues(j.Name, "memory", "won"))
			if won != 2 {
				t.Errorf("scheduler_claims_total{job=%q,result=won} = %v, want 2", j.Name, won)
			}
		}
		if n := testutil.CollectAndCount(reg, "scheduler_claim_duration_seconds"); n != 1 {
			t.Errorf("claim duration histogram series = %d, want 1 (claimer label only)", n)
		}
	})
}

// forgetful is a claimer whose backend lost its data: until guard it holds
// every run and says why, as the redis claimer does after its server
// restarted empty. With extended set, each answer names a guard over
// that much later (or at guard, if sooner), as a guard the replicas'
// write-backs keep extending does.
type forgetful struct {
	claim.Claimer
	mu       sync.Mutex
	guard    time.Time
	extended time.Duration
	held     map[string]int // guarded answers, by run ID
}

// heldAnswers is how many times f answered run with its guard.
func (f *forgetful) heldAnswers(run claim.Run) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[run.ID()]
}

func (f *forgetful) lose(until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.guard = until
}

func (f *forgetful) Claim(ctx context.Context, runs []claim.Run, l time.Duration) ([]*claim.Claim, []error) {
	f.mu.Lock()
	until := f.guard
	if soon := time.Now().Add(f.extended); f.extended > 0 && soon.Before(until) {
		until = soon
	}
	f.mu.Unlock()
	return claim.EachRun(runs, func(r claim.Run) (*claim.Claim, error) {
		if time.Now().Before(until) {
			f.mu.Lock()
			if f.held == nil {
				f.held = map[string]int{}
			}
			f.held[r.ID()]++
			f.mu.Unlock()
			return nil, fmt.Errorf("claim %s: %w: %w", r.ID(), &claim.DataLossError{Backend: "the test server", Until: until}, claim.ErrHeld)
		}
		return claim.ClaimOne(ctx, f.Claimer, r, l)
	})
}

// TestDataLossWarnsOncePerLoss: while the backend holds every run after
// losing its data, each run in flight hears of it; the operator gets one
// warning and one count per loss, the runs are held (not failed), and
// they run once the backend's guard is over.
func TestDataLossWarnsOncePerLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs, logger, reg, metrics := observed(slog.LevelInfo)
		led := newLedger()
		const lease = 3 * time.Second
		c := &forgetful{Claimer: memory.New(memory.NewStore(nil), "a")}
		var jobs []runner.Job
		for _, name := range []string{"job.a", "job.b", "job.c"} {
			jobs = append(jobs, runner.Job{Name: name, Schedule: mustSchedule(t, "* * * * * *"), Overlap: runner.OverlapAllow,
				Handler: func(context.Context, job.Run) error { return nil }})
		}
		r, err := runner.New(runner.Options{Claimer: led.claimer("a", c), ClaimerName: "redis", Instance: "a", Lease: lease,
			Logger: logger, Metrics: metrics, Observe: led.observer("a")}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second - time.Millisecond)))
		losses := []time.Time{time.Now().Add(lease), time.Now().Add(3 * lease)}
		c.lose(losses[0])
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		time.Sleep(2 * lease) // the first loss is over by now
		c.lose(losses[1])
		time.Sleep(3 * lease)
		cancel()
		<-done

		var warned []string
		for _, l := range logs.JSONLines() {
			if l["msg"] == "claimer backend lost its data" {
				if l["level"] != "WARN" || l["claimer"] != "redis" || l["instance"] != "a" {
					t.Errorf("warning %v: want level WARN, claimer redis, instance a", l)
				}
				warned = append(warned, fmt.Sprint(l["held_until"]))
			}
		}
		want := []string{losses[0].UTC().Format(time.RFC3339Nano), losses[1].UTC().Format(time.RFC3339Nano)}
		if strings.Join(warned, " ") != strings.Join(want, " ") {
			t.Errorf("warnings held_until %v, want one per loss: %v", warned, want)
		}
		checkDataLossCounter(t, reg, "redis", 2)
		// Held, not failed: runs due during a loss ran once it was over.
		for _, j := range jobs {
			at := losses[0].Add(-lease).Truncate(time.Second).Add(time.Second)
			id := claim.Run{Job: j.Name, At: at}.ID()
			if s := led.starts(id); len(s) != 1 || !s[0].Requested.After(losses[0].Add(-time.Millisecond)) {
				t.Errorf("%s due during the first loss: starts %+v, want one, after the loss", id, s)
			}
		}
		led.check(t, history.Spec{})
	})
}

// watching is a claimer that finds a loss outside any claim, as the redis
// claimer's done watcher does (claim.LossWatcher).
type watching struct {
	claim.Claimer
	report chan func(*claim.DataLossError)
}

func (w *watching) WatchLoss(report func(*claim.DataLossError)) { w.report <- report }

// TestALossNoClaimMeetsIsWarnedAndCounted: a backend that lost its data
// while no claim came (an idle fleet) was never reported; a claimer that
// watches for losses now reports them to the runner, which warns and
// counts each once, as for a loss a claim met.
func TestALossNoClaimMeetsIsWarnedAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs, logger, reg, metrics := observed(slog.LevelInfo)
		c := &watching{Claimer: memory.New(memory.NewStore(nil), "a"), report: make(chan func(*claim.DataLossError), 1)}
		jobs := []runner.Job{{Name: "job.idle", Schedule: mustSchedule(t, "@every 1h"),
			Handler: func(context.Context, job.Run) error { return nil }}}
		r, err := runner.New(runner.Options{Claimer: c, ClaimerName: "redis", Instance: "a", Logger: logger, Metrics: metrics}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		report := <-c.report
		until := time.Now().Add(time.Minute)
		loss := &claim.DataLossError{Backend: "the test server", Until: until}
		report(loss)
		report(loss) // the same loss, found again: one warning
		cancel()
		<-done
		warned := 0
		for _, l := range logs.JSONLines() {
			if l["msg"] == "claimer backend lost its data" {
				warned++
				if l["held_until"] != until.UTC().Format(time.RFC3339Nano) {
					t.Errorf("warning %v: want held_until %s", l, until.UTC().Format(time.RFC3339Nano))
				}
			}
		}
		if warned != 1 {
			t.Errorf("%d warnings of the loss, want 1:\n%s", warned, logs)
		}
		checkDataLossCounter(t, reg, "redis", 1)
	})
}

// holding is a claimer whose hold on takeovers the test sets.
type holding struct {
	claim.Claimer
	held atomic.Bool
}

func (h *holding) TakeoversHeld(time.Duration) bool { return h.held.Load() }

// TestAHoldOnTakeoversIsLoggedAndExported: while the claimer holds
// takeovers back after unanswered calls (claim.TakeoverHolder), the
// runner says so once, as a warning, says when it ends, and keeps
// scheduler_takeovers_held at 1 meanwhile (an outside review: nothing
// said why a dead holder's runs waited after a stall).
func TestAHoldOnTakeoversIsLoggedAndExported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		holdSaid(t, false, "WARN", func(l map[string]any) bool { return l["reason"] != nil })
	})
}

// TestAStartHoldIsSaidAtInfo: a claimer starts with takeovers held
// (claim.Unanswered.Start); the runner says so at once, at info, with
// the start as the reason (every start has it: no warning), exports 1,
// and says when it ends.
func TestAStartHoldIsSaidAtInfo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		holdSaid(t, true, "INFO", func(l map[string]any) bool {
			reason, _ := l["reason"].(string)
			return strings.HasPrefix(reason, "starting")
		})
	})
}

// holdSaid runs a replica over a claimer that holds takeovers for a
// lease, from its start if atStart, else from a lease into its run, and
// checks the gauge meanwhile and that the runner said "takeovers held"
// at level, with a line that passes reason, and then "takeovers
// resumed".
func holdSaid(t *testing.T, atStart bool, level string, reason func(map[string]any) bool) {
	t.Helper()
	logs, logger, reg, metrics := observed(slog.LevelInfo)
	c := &holding{Claimer: memory.New(memory.NewStore(nil), "a")}
	c.held.Store(atStart)
	jobs := []runner.Job{{Name: "job.idle", Schedule: mustSchedule(t, "@every 1h"),
		Handler: func(context.Context, job.Run) error { return nil }}}
	const lease = 2 * time.Second
	r, err := runner.New(runner.Options{Claimer: c, ClaimerName: "redis", Instance: "a", Lease: lease, Logger: logger, Metrics: metrics}, jobs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	if !atStart {
		time.Sleep(lease)
		heldGauge(t, reg, 0)
		c.held.Store(true)
		time.Sleep(lease) // a stall's hold: at least a lease
	} else {
		time.Sleep(lease / 8) // the runner looks at once
	}
	heldGauge(t, reg, 1)
	c.held.Store(false)
	time.Sleep(lease)
	heldGauge(t, reg, 0)
	cancel()
	<-done
	var said []string
	for _, l := range logs.JSONLines() {
		switch l["msg"] {
		case "takeovers held":
			if l["level"] != level || l["claimer"] != "redis" || !reason(l) {
				t.Errorf("%v: want level %s, the claimer named, and the reason", l, level)
			}
			said = append(said, "held")
		case "takeovers resumed":
			said = append(said, "resumed")
		}
	}
	if !slices.Equal(said, []string{"held", "resumed"}) {
		t.Errorf("said %v, want [held resumed]:\n%s", said, logs)
	}
}

// heldGauge checks that scheduler_takeovers_held{claimer="redis"} in reg
// is want.
func heldGauge(t *testing.T, reg prometheus.Gatherer, want int) {
	t.Helper()
	expected := fmt.Sprintf(`
# HELP scheduler_takeovers_held 1 while this replica's claimer takes no lapsed lease over because it has just started or its backend lately left calls unanswered (a stall, an outage): a dead holder's runs wait until the backend has answered for a lease, so that a live holder's release lands first.
# TYPE scheduler_takeovers_held gauge
scheduler_takeovers_held{claimer="redis"} %d
`, want)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expected), "scheduler_takeovers_held"); err != nil {
		t.Error(err)
	}
}

// A handler that ignores its cancellation keeps its claim until it
// returns (handed back while it runs, the run could start elsewhere beside
// it), and the shutdown says, every few seconds, which runs it waits on
// (an outside review found it silent for as long).
func TestAShutdownWaitingOnAStubbornHandlerSaysWhich(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs, logger, _, _ := observed(slog.LevelInfo)
		started := make(chan struct{}, 1)
		jobs := []runner.Job{{Name: "job.stubborn", Schedule: mustSchedule(t, "@every 1h"),
			Handler: func(ctx context.Context, run job.Run) error {
				started <- struct{}{}
				time.Sleep(12 * time.Second) // ctx ignored
				return nil
			}}}
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour - time.Second)))
		store := memory.NewStore(nil)
		r, err := runner.New(runner.Options{Claimer: memory.New(store, "a"), ClaimerName: "memory", Instance: "a",
			Lease: 3 * time.Second, ShutdownGrace: time.Second, Logger: logger}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		<-started
		cancel()
		<-done
		id := claim.Run{Job: "job.stubborn", At: time.Now().Truncate(time.Hour).UTC()}.ID()
		said := 0
		for _, l := range logs.JSONLines() {
			if l["msg"] == "handlers ignore their cancellation; their claims are kept alive until they return" {
				said++
				if runs, _ := l["runs"].([]any); len(runs) != 1 || runs[0] != id {
					t.Errorf("the line names runs %v, want [%s]", l["runs"], id)
				}
			}
		}
		// Grace 1s, then the handler's 11s left: a line at 5s and 10s.
		if said != 2 {
			t.Errorf("%d lines naming the runs waited on, want 2:\n%s", said, logs)
		}
		recs, err := memory.New(store, "reader").History(context.Background(), "job.stubborn", 0)
		if err != nil || len(recs) == 0 || recs[0].RunID != id || recs[0].Status != claim.Succeeded {
			t.Fatalf("history %+v, %v: want %s succeeded, its claim kept until it returned", recs, err, id)
		}
	})
}

// The data-loss counter is there, at zero, before any loss: a dashboard
// shows 0 rather than "no data", and an alert's rate sees the first one
// (an outside review found it absent until then).
func TestTheDataLossCounterStartsAtZero(t *testing.T) {
	_, _, reg, metrics := observed(slog.LevelInfo)
	jobs := []runner.Job{{Name: "job.any", Schedule: mustSchedule(t, "@every 1h"),
		Handler: func(ctx context.Context, run job.Run) error { return nil }}}
	if _, err := runner.New(runner.Options{Claimer: memory.New(memory.NewStore(nil), "a"), ClaimerName: "memory",
		Instance: "a", Metrics: metrics}, jobs); err != nil {
		t.Fatal(err)
	}
	checkDataLossCounter(t, reg, "memory", 0)
}

// checkDataLossCounter checks reg's scheduler_claimer_data_loss_total: one
// series, for claimer, at n.
func checkDataLossCounter(t *testing.T, reg *prometheus.Registry, claimer string, n int) {
	t.Helper()
	expected := fmt.Sprintf(`
# HELP scheduler_claimer_data_loss_total Times the claimer's backend was found to have lost its data (a Redis server restarted empty); it then holds every run for a lease.
# TYPE scheduler_claimer_data_loss_total counter
scheduler_claimer_data_loss_total{claimer=%q} %d
`, claimer, n)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expected), "scheduler_claimer_data_loss_total"); err != nil {
		t.Error(err)
	}
}

// earlierRunEndsElsewhere runs replica "a" over c (which logs to led)
// with a job ticking every 2s, in a synctest bubble: its run r0 (at
// t0+2s) is held elsewhere from t0+1.9s, so that the replica watches it,
// and released as succeeded at t0+releaseAt; then ends() is called, and
// the replica stops at t0+stopAt. The next run, r1 (t0+4s), must have
// started once, as due while r0's end was unknown to c's answers (why),
// and r0 never here.
func earlierRunEndsElsewhere(t *testing.T, store *memory.Store, led *ledger, c claim.Claimer, lease time.Duration,
	t0 time.Time, releaseAt, stopAt time.Duration, ended func(), why string) (r0, r1 claim.Run) {
	t.Helper()
	other := memory.New(store, "x") // r0's holder, outside the runner
	jobs := []runner.Job{{Name: "tick", Schedule: mustSchedule(t, "*/2 * * * * *"),
		Handler: func(context.Context, job.Run) error { return nil }}}
	r, err := runner.New(runner.Options{Claimer: c, Instance: "a", Lease: lease, Observe: led.observer("a")}, jobs)
	if err != nil {
		t.Fatal(err)
	}
	r0, r1 = claim.Run{Job: "tick", At: t0.Add(2 * time.Second)}, claim.Run{Job: "tick", At: t0.Add(4 * time.Second)}
	time.Sleep(time.Until(t0.Add(1900 * time.Millisecond)))
	held, err := claim.ClaimOne(t.Context(), other, r0, stopAt) // live until released
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	time.Sleep(time.Until(t0.Add(releaseAt)))
	if err := claim.ReleaseOne(t.Context(), other, held, claim.Succeeded); err != nil {
		t.Fatal(err)
	}
	ended()
	time.Sleep(time.Until(t0.Add(stopAt)))
	cancel()
	<-done
	if s := led.starts(r1.ID()); len(s) != 1 {
		led.explain(t, r1.ID())
		t.Fatalf("%s, due %s, started %d times, want once", r1.ID(), why, len(s))
	}
	if s := led.starts(r0.ID()); len(s) != 0 {
		t.Fatalf("%s, run elsewhere, started %d times here", r0.ID(), len(s))
	}
	return r0, r1
}

// TestAnEarlierRunHeldOnlyByARestartGuardIsNoOverlap: a replica watched
// an earlier run held elsewhere; the run ended, and the backend, having
// lost its data, held every run for a while (the redis claimer's restart
// guard). The next instant came during the guard. Its overlap probe of
// the earlier run heard "held", by the guard, not by a holder, and
// counted it live: the instant was skipped for good, for a run that had
// ended (the explorer's skipped-idle invariant, on a Redis Cluster). A
// guard says nothing of the run; the probe asks again once it is over,
// and not within it.
func TestAnEarlierRunHeldOnlyByARestartGuardIsNoOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, led := memory.NewStore(nil), newLedger()
		a := &forgetful{Claimer: memory.New(store, "a")}
		t0 := time.Now().Truncate(2 * time.Second)
		r0, _ := earlierRunEndsElsewhere(t, store, led, led.claimer("a", a), 3*time.Second, t0,
			3500*time.Millisecond, 10*time.Second,
			func() { a.lose(t0.Add(5500 * time.Millisecond)) }, // the guard: over 1.5s after r1's instant
			"during the guard after the earlier run ended")
		// Within the guard the probe asked once, then waited it out: the
		// answers a held-by-a-holder retry would get there were known (it
		// asked 3 times more, 6 answers in all with the watcher's here).
		if n := a.heldAnswers(r0); n > 3 {
			t.Errorf("%s was asked %d times within the guard, want at most 3 (the probe once, the watcher twice)", r0.ID(), n)
		}
	})
}

// TestAnEarlierRunHeldByAnExtendedRestartGuardIsNoOverlap: as above, but
// the guard, as each answer names it, ends within 200ms, and is extended
// again and again (the replicas' write-backs extend it, each by a lease,
// a keeper every lease/4, and a replica that was paused or cut off
// writes back once it is back). The probe waited out each guard it was
// told of, three times, and then counted the ended run live: the instant
// was skipped for good (the explorer's skipped-idle on Redis, seed
// 50000029: a replica back from a crash into the guard of a rewound
// server, while a paused replica's late write-back extended it). The
// probe waits guards out by time, not by tries.
func TestAnEarlierRunHeldByAnExtendedRestartGuardIsNoOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, led := memory.NewStore(nil), newLedger()
		a := &forgetful{Claimer: memory.New(store, "a"), extended: 200 * time.Millisecond}
		t0 := time.Now().Truncate(2 * time.Second)
		earlierRunEndsElsewhere(t, store, led, led.claimer("a", a), 3*time.Second, t0,
			3500*time.Millisecond, 10*time.Second,
			func() { a.lose(t0.Add(5500 * time.Millisecond)) }, // extended until 1.5s after r1's instant
			"during a guard extended again and again after the earlier run ended")
	})
}

// holdingBack is a claimer that holds takeovers of lapsed leases back
// until a time (claim.TakeoverHolder), as the networked claimers do after
// their backend stalled, was cut off or refused writes.
type holdingBack struct {
	claim.Claimer
	until time.Time
}

func (h *holdingBack) TakeoversHeld(time.Duration) bool { return time.Now().Before(h.until) }

// TestAnEarlierRunHeldDuringATakeoverHoldIsAskedAgainAfterIt: a replica
// watched an earlier run held elsewhere; the claimer held takeovers back
// (a stall or refused writes had just ended), when a lapsed lease, whose
// holder's release has yet to land, reads as held. The next instant came
// during the hold. Its overlap probe heard "held", and counted the run
// live: the instant was skipped for good, though the earlier run's
// release landed before the hold was over (the explorer's skipped-idle
// on Redlock, seed 34000023, where nobody held the run at all: a bid
// that won no majority, its abort refused). The probe asks again once
// the hold is over.
func TestAnEarlierRunHeldDuringATakeoverHoldIsAskedAgainAfterIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, led := memory.NewStore(nil), newLedger()
		t0 := time.Now().Truncate(2 * time.Second)
		a := &holdingBack{Claimer: led.claimer("a", memory.New(store, "a")), until: t0.Add(5500 * time.Millisecond)}
		// r0's release lands 1.2s after r1's instant, within the hold.
		earlierRunEndsElsewhere(t, store, led, a, time.Second, t0, 5200*time.Millisecond, 9*time.Second, func() {},
			"during the hold while the earlier run's release was on its way")
	})
}
