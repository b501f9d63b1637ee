package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// start is one run's start as a replica observed it.
type start struct {
	replica string
	lag     time.Duration
}

// fleetStarts runs 150 jobs due every 10s on three replicas sharing a
// memory store, with the register (controls) or without, for 25 fake
// seconds, and returns each run's starts after the first instant (whose
// runs are dispatched at start-up, before any replica has read the
// fleet). ghost, if set, is announced in the register for the whole test
// and never runs: a replica that died a moment ago.
func fleetStarts(t *testing.T, controls bool, ghost string, spread time.Duration) map[claim.Run][]start {
	store := memory.NewStore(nil)
	if ghost != "" {
		if err := control.New(store.Controls(), nil).Announce(t.Context(), ghost, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	led := newLedger()
	var list []runner.Job
	for i := range 150 {
		list = append(list, runner.Job{Name: fmt.Sprintf("j%03d", i), Schedule: mustSchedule(t, "@every 10s"),
			Handler: func(context.Context, job.Run) error { return nil }})
	}
	first := time.Now()
	var mu sync.Mutex
	starts := map[claim.Run][]start{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 3 {
		name := fmt.Sprintf("r%d", i)
		o := runner.Options{Claimer: led.claimer(name, memory.New(store, name)), ClaimerName: "memory", Instance: name,
			Lease: 3 * time.Second, Spread: spread}
		if controls {
			o.Controls = control.New(store.Controls(), nil)
		}
		observe := led.observer(name)
		o.Observe = func(e runner.Event) {
			observe(e)
			if e.Kind == runner.EventStarted && e.Run.At.After(first) {
				mu.Lock()
				starts[e.Run] = append(starts[e.Run], start{name, time.Since(e.Run.At)})
				mu.Unlock()
			}
		}
		r, err := runner.New(o, list)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	time.Sleep(25 * time.Second)
	cancel()
	wg.Wait()
	led.check(t, history.Spec{Forbid: forbidAll(list)})
	if len(starts) < 300 {
		t.Fatalf("%d runs started after the first instant, want 150 jobs × 2 instants", len(starts))
	}
	for run, s := range starts {
		if len(s) != 1 {
			t.Fatalf("run %s started %d times: %v", run.ID(), len(s), s)
		}
	}
	return starts
}

// ownerOf is the member whose hash of the run is least.
func ownerOf(run claim.Run, members []string) string {
	best := ""
	for _, m := range members {
		if best == "" || runner.HoldFor(run.ID(), m, time.Second) < runner.HoldFor(run.ID(), best, time.Second) {
			best = m
		}
	}
	return best
}

// TestReplicasThatKnowEachOtherStartTheirOwnRunsAtOnce: with the fleet
// read from the register, each run's owner (the least hash among the
// replicas up) bids for it without holding back, and the others only
// after the spread, so every run starts on its owner before any
// other replica bids, and a replica that died a moment ago (still listed)
// loses none of its runs: the others start them after their hold. The
// same fleet without the register holds each run back by the least of
// three uniform holds, which often passes half the spread.
func TestReplicasThatKnowEachOtherStartTheirOwnRunsAtOnce(t *testing.T) {
	const spread = 200 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		members := []string{"r0", "r1", "r2", "r9-ghost"}
		shares := map[string]int{}
		ghostRuns := 0
		for run, s := range fleetStarts(t, true, "r9-ghost", spread) {
			switch owner := ownerOf(run, members); {
			case owner == "r9-ghost":
				ghostRuns++
				if s[0].lag < spread {
					t.Errorf("run %s of the dead replica started on %s after %v, before the others' hold of the spread",
						run.ID(), s[0].replica, s[0].lag)
				}
			case s[0].replica != owner || s[0].lag >= spread/2:
				t.Errorf("run %s started on %s after %v, want on its owner %s before half the spread (%v)",
					run.ID(), s[0].replica, s[0].lag, owner, spread/2)
			default:
				shares[owner]++
			}
		}
		if ghostRuns == 0 || len(shares) != 3 {
			t.Fatalf("owners: %v and the dead replica %d: the case proves nothing", shares, ghostRuns)
		}
		t.Logf("started by their owners %v; the dead replica's %d by the others", shares, ghostRuns)

		late := 0
		for _, s := range fleetStarts(t, false, "", spread) {
			if s[0].lag >= spread/2 {
				late++
			}
		}
		if late == 0 {
			t.Fatal("without the register no run waited half the spread: the case proves nothing")
		}
	})
}

// TestAReplicaThatStopsLeavesTheFleetAtOnce: a replica that shuts down
// withdraws its announcement before Run returns, so the others stop
// counting it (and holding back for it) at their next read, not when its
// entry would have expired, several seconds later.
func TestAReplicaThatStopsLeavesTheFleetAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		reg := control.New(store.Controls(), nil)
		members := func() []string {
			t.Helper()
			ms, err := reg.Members(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return ms
		}
		r, err := runner.New(runner.Options{Claimer: memory.New(store, "r0"), ClaimerName: "memory", Instance: "r0",
			Lease: 3 * time.Second, Controls: control.New(store.Controls(), nil)},
			[]runner.Job{{Name: "j", Schedule: mustSchedule(t, "@every 1h"), Handler: func(context.Context, job.Run) error { return nil }}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if ms := members(); len(ms) != 1 || ms[0] != "r0" {
			t.Fatalf("members while r0 runs: %q, want [r0]", ms)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if ms := members(); len(ms) != 0 {
			t.Fatalf("members once r0 stopped: %q, want none (its entry would have lasted seconds more)", ms)
		}
	})
}

// Two processes given one instance_id (one config file for every replica,
// instance_id set in it) are told apart by their member entries, and each
// says so: nothing runs twice for it, but the fleet counts them as one
// and one's leave withdraws the other. One replica restarted under its
// name says nothing: its predecessor's entry is gone by its first check.
func TestTwoProcessesUnderOneInstanceIDAreWarnedOf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		twins bool
	}{{"two at once", true}, {"one restarted", false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore(nil)
				logs, logger, _, _ := observed(slog.LevelInfo)
				replica := func() (stop func()) {
					ctx, cancel := context.WithCancel(t.Context())
					r, err := runner.New(runner.Options{Claimer: memory.New(store, "dup"), Instance: "dup", Lease: 3 * time.Second,
						Controls: control.New(store.Controls(), nil), Logger: logger},
						[]runner.Job{{Name: "tick", Schedule: mustSchedule(t, "*/5 * * * * *"),
							Handler: func(ctx context.Context, run job.Run) error { return nil }}})
					if err != nil {
						t.Fatal(err)
					}
					return running(t, ctx, cancel, r)
				}
				first := replica()
				if !tc.twins {
					time.Sleep(5 * time.Second)
					first() // stopped (its leave withdraws its entry) ...
				}
				// Two processes tick a fraction of a second apart (in a
				// bubble, started together, they would tick in step, and
				// only the one that reads last would see the other).
				time.Sleep(300 * time.Millisecond)
				second := replica() // ... or running beside the second
				time.Sleep(30 * time.Second)
				second()
				if tc.twins {
					first()
				}
				warned := strings.Count(logs.String(), "another process announces itself under this instance_id")
				switch {
				case tc.twins && warned != 2:
					t.Errorf("%d warnings of two processes under one instance_id, want one from each", warned)
				case !tc.twins && warned != 0:
					t.Errorf("a replica restarted under its name was warned of a twin %d times", warned)
				}
			})
		})
	}
}

// running runs r until the returned func cancels ctx (with cancel) and
// checks that Run returned no error.
func running(t *testing.T, ctx context.Context, cancel context.CancelFunc, r *runner.Runner) (stop func()) {
	t.Helper()
	return runningCut(t, ctx, cancel, r, nil)
}

// runningCut is running for a replica that may be cut off from its
// backend when it stops (cut reports it): then Run must say that its
// releases were not confirmed (ErrUnavailable).
func runningCut(t *testing.T, ctx context.Context, cancel context.CancelFunc, r *runner.Runner, cut func() bool) (stop func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() {
		cancel()
		err := <-done
		switch {
		case cut != nil && cut():
			if !errors.Is(err, claim.ErrUnavailable) {
				t.Errorf("Run of a replica cut off from its backend: %v, want its releases unconfirmed (ErrUnavailable)", err)
			}
		case err != nil:
			t.Error(err)
		}
	}
}
