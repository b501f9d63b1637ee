package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/job"
)

// downClaimer refuses (ErrUnavailable) or stalls every claim while mode
// says so.
type downClaimer struct {
	claim.Claimer
	mode func() string
}

func (d *downClaimer) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	switch d.mode() {
	case "refuse":
		errs := make([]error, len(runs))
		for i := range errs {
			errs[i] = fmt.Errorf("down: %w", claim.ErrUnavailable)
		}
		return make([]*claim.Claim, len(runs)), errs
	case "stall":
		<-ctx.Done()
		errs := make([]error, len(runs))
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return make([]*claim.Claim, len(runs)), errs
	}
	return d.Claimer.Claim(ctx, runs, lease)
}

// A run missed while the backend refused or stalled every claim is
// recorded missed with reason backend_unavailable, whichever path won it
// after the outage (its own contention, or a later instant's overlap
// probe, which knew nothing of the outage and said fell_behind: an
// outside review stopped Redis for 20s under one replica).
func TestARunMissedWhileTheBackendWasDownSaysSo(t *testing.T) {
	for _, m := range []string{"refuse", "stall"} {
		t.Run(m, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore(nil)
				start := time.Now()
				mode := func() string {
					if d := time.Since(start); d > 10*time.Second && d < 30*time.Second {
						return m
					}
					return ""
				}
				var mu sync.Mutex
				causes := map[string]int{}
				r, err := runner.New(runner.Options{Claimer: &downClaimer{memory.New(store, "a"), mode}, ClaimerName: "memory", Instance: "a",
					Lease: 3 * time.Second, MaxClockSkew: time.Second,
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
					Observe: func(e runner.Event) {
						if e.Kind == runner.EventSkipped {
							mu.Lock()
							if e.Reason == runner.ReasonMissed {
								causes[e.Cause]++
							}
							mu.Unlock()
						}
					}}, []runner.Job{{Name: "tick", Schedule: mustSchedule(t, "@every 3s"), Handler: func(ctx context.Context, run job.Run) error { return nil }}})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); _ = r.Run(ctx) }()
				time.Sleep(45 * time.Second)
				cancel()
				<-done
				if causes[runner.MissedUnavailable] < 3 || len(causes) != 1 {
					t.Errorf("missed runs by cause: %v, want backend_unavailable only, for the outage's instants", causes)
				}
			})
		})
	}
}

// silentReleases fails every release with ErrUnavailable once down is set:
// a backend that went away under a shutting-down replica.
type silentReleases struct {
	claim.Claimer
	down *atomic.Bool
}

func (s *silentReleases) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	if !s.down.Load() {
		return s.Claimer.Release(ctx, cls, outs)
	}
	errs := make([]error, len(cls))
	for i := range errs {
		errs[i] = fmt.Errorf("silent: %w", claim.ErrUnavailable)
	}
	return errs
}

// A shutdown whose hand-back the backend never confirmed is not a clean
// one: Run says so (the process exits 1), after trying for a lease. One
// whose backend answered returns nil. (Two outside reviews expected the
// exit code to tell them apart.)
func TestAShutdownWhoseHandBackWasNotConfirmedSaysSo(t *testing.T) {
	for _, down := range []bool{false, true} {
		t.Run(fmt.Sprintf("backend down %v", down), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var silent atomic.Bool
				started := make(chan struct{}, 1)
				r, err := runner.New(runner.Options{
					Claimer: &silentReleases{memory.New(memory.NewStore(nil), "a"), &silent}, ClaimerName: "memory", Instance: "a",
					Lease: 3 * time.Second, MaxClockSkew: time.Second, ShutdownGrace: time.Second,
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				}, []runner.Job{{Name: "long", Schedule: mustSchedule(t, "@every 10s"), Handler: func(ctx context.Context, run job.Run) error {
					select {
					case started <- struct{}{}:
					default:
					}
					<-ctx.Done()
					return ctx.Err()
				}}})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- r.Run(ctx) }()
				<-started
				silent.Store(down)
				stopped := time.Now()
				cancel()
				err = <-done
				switch {
				case !down && err != nil:
					t.Errorf("Run: %v, want nil: the hand-back was confirmed", err)
				case down && (!errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), "1 releases were not confirmed")):
					t.Errorf("Run: %v, want ErrUnavailable saying one release was not confirmed", err)
				case down && time.Since(stopped) < 3*time.Second:
					t.Errorf("Run returned %v after the shutdown began: it gave the release less than a lease", time.Since(stopped))
				}
			})
		})
	}
}

// unreadable fails every history read while down is set: a schema rolled
// back under a live fleet (an outside review ran `migrate down`, which
// dropped the history function, beside three replicas), a revoked grant.
// Claims, renewals and releases still work.
type unreadable struct {
	claim.Claimer
	down *atomic.Bool
}

func (u *unreadable) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	if u.down.Load() {
		return nil, errors.New("unreadable: function scheduler_history does not exist")
	}
	return u.Claimer.History(ctx, job, limit)
}

// A run granted while its job's history cannot be read does not wait to
// start for as long as the reads fail: once past its deadline it is
// recorded missed (backend_unavailable), as a claim that came that late
// would be, and the replica says why in a warning. Held instead, it kept
// the job's later instants out (skipped as overlap) and started a minute
// late when the reads came back. Once they do, the job runs again.
func TestARunWhoseOwnersCannotBeReadIsMissedNotHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		var down atomic.Bool
		var logs strings.Builder
		var mu sync.Mutex
		causes := map[string]int{}
		other := map[string]int{}
		var started []time.Time
		r, err := runner.New(runner.Options{Claimer: &unreadable{memory.New(store, "a"), &down}, ClaimerName: "memory", Instance: "a",
			Lease: 3 * time.Second, MaxClockSkew: time.Second,
			Logger: slog.New(slog.NewTextHandler(&logs, nil)), // the handler serialises its writes
			Observe: func(e runner.Event) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case e.Kind == runner.EventStarted:
					started = append(started, e.Run.At)
				case e.Kind == runner.EventSkipped && e.Reason == runner.ReasonMissed:
					causes[e.Cause]++
				case e.Kind == runner.EventSkipped:
					other[e.Reason]++
				}
			}}, []runner.Job{{Name: "tick", Schedule: mustSchedule(t, "*/10 * * * * *"), Handler: func(ctx context.Context, run job.Run) error { return nil }}})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute + 5*time.Second)))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		time.Sleep(20 * time.Second) // :10 and :20 run
		down.Store(true)
		broke := time.Now()
		time.Sleep(40 * time.Second) // :30 to :60 fall due unreadable
		down.Store(false)
		mended := time.Now()
		time.Sleep(25 * time.Second) // the instants after it run
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, at := range started {
			if at.After(broke) && at.Before(mended.Add(-8*time.Second)) {
				t.Errorf("the instant %s started while the history could not be read", at.Format(time.TimeOnly))
			}
		}
		after := 0
		for _, at := range started {
			if at.After(mended) {
				after++
			}
		}
		if causes[runner.MissedUnavailable] < 3 || len(causes) != 1 || len(other) != 0 || after < 2 {
			t.Errorf("missed by cause %v, other skips %v, %d instants run after the reads came back: "+
				"want the unreadable instants missed (backend_unavailable), none skipped, the later ones run", causes, other, after)
		}
		for at, st := range statuses(t, store, "tick") {
			if at.After(broke) && at.Before(mended.Add(-8*time.Second)) && st != claim.Missed {
				t.Errorf("%s recorded %s, want missed", at.Format(time.TimeOnly), st)
			}
		}
		if !strings.Contains(logs.String(), "cannot read the job's history") {
			t.Errorf("no warning that the history could not be read:\n%s", logs.String())
		}
	})
}

// A backend that refuses every claim is logged at most once each
// claimLogEvery (5s) per replica, each line saying how many runs failed
// unlogged since, not once per run: with 2,000 jobs, one 15s stall was
// 1,900 error lines per replica (an outside review).
func TestFailedClaimsAreLoggedOncePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		start := time.Now()
		mode := func() string {
			if d := time.Since(start); d > 10*time.Second && d < 30*time.Second {
				return "refuse"
			}
			return ""
		}
		var jobs []runner.Job
		for i := range 100 {
			jobs = append(jobs, runner.Job{Name: fmt.Sprintf("job.%03d", i), Schedule: mustSchedule(t, "@every 5s"),
				Handler: func(context.Context, job.Run) error { return nil }})
		}
		var logs strings.Builder
		r, err := runner.New(runner.Options{Claimer: &downClaimer{memory.New(store, "a"), mode}, ClaimerName: "memory", Instance: "a",
			Lease: 3 * time.Second, MaxClockSkew: time.Second, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(ctx) }()
		time.Sleep(40 * time.Second)
		cancel()
		<-done
		lines, runs, again := 0, 0, 0
		for line := range strings.Lines(logs.String()) {
			var e struct {
				Msg            string
				OthersFailed   int `json:"others_failed"`
				FailedUnlogged int `json:"failed_unlogged"`
			}
			switch {
			case json.Unmarshal([]byte(line), &e) != nil:
			case e.Msg == "claim failed; retrying":
				lines++
				runs += 1 + e.OthersFailed
			case e.Msg == "claims answered again":
				again++
				runs += e.FailedUnlogged
			}
		}
		if lines == 0 || lines > 5 || again != 1 || runs < 100 {
			t.Fatalf("%d lines and %d 'answered again' for %d failing runs in a 20s refusal of 100 jobs every 5s: "+
				"want 1 to 5 lines, one 'answered again', counting at least 100", lines, again, runs)
		}
		t.Logf("%d lines, %d failing runs counted", lines, runs)
	})
}

// A release batch stuck in a stalled backend does not keep the releases
// that queue behind it in the process: after a tenth of a lease they go
// in a batch of their own. Waiting here, they were lost with a replica
// killed during the stall, and their runs, handlers done, ran again (an
// outside review: 79 runs after a 6s Redis stop, a replica killed 1s
// into it); sent, they wait in the backend's socket and land.
func TestReleasesDoNotQueueBehindABatchStuckInTheBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now().Truncate(10 * time.Second).Add(10 * time.Second)
		time.Sleep(time.Until(start))
		at := start.Truncate(time.Minute).Add(time.Minute) // the jobs' next instant
		c := &stuckRelease{Claimer: memory.New(memory.NewStore(nil), "r1"), at: at, unstick: make(chan struct{}), calls: make(chan []claim.Run, 10)}
		sleeper := func(d time.Duration) job.Handler {
			return func(ctx context.Context, run job.Run) error {
				time.Sleep(d)
				return nil
			}
		}
		const lease = 4 * time.Second
		r, err := runner.New(runner.Options{Claimer: c, Instance: "r1", Lease: lease}, []runner.Job{
			{Name: "a", Schedule: mustSchedule(t, "0 * * * * *"), Handler: sleeper(100 * time.Millisecond)},
			{Name: "b", Schedule: mustSchedule(t, "0 * * * * *"), Handler: sleeper(300 * time.Millisecond)},
		})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		first := <-c.calls // a's release, stuck
		if len(first) != 1 || first[0].Job != "a" {
			t.Fatalf("first release batch %v, want a's alone", first)
		}
		stuckAt := time.Now()
		select {
		case next := <-c.calls:
			if len(next) != 1 || next[0].Job != "b" {
				t.Fatalf("second release batch %v, want b's", next)
			}
			if waited := time.Since(stuckAt); waited > lease/10+100*time.Millisecond {
				t.Fatalf("b's release went %v after a's got stuck, want within a tenth of the lease after it", waited)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("b's release waited in the process behind a's stuck batch")
		}
		close(c.unstick)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// stuckRelease holds the first release call of runs at until unstick is
// closed, as a stalled backend would; calls reports every such call's
// runs. (The look-back's record of the instant before start goes by.)
type stuckRelease struct {
	claim.Claimer
	at      time.Time
	unstick chan struct{}
	calls   chan []claim.Run
	n       atomic.Int32
}

func (s *stuckRelease) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	runs := make([]claim.Run, len(cls))
	for i, cl := range cls {
		runs[i] = cl.Run
	}
	if !runs[0].At.Equal(s.at) {
		return s.Claimer.Release(ctx, cls, outs)
	}
	s.calls <- runs
	if s.n.Add(1) == 1 {
		<-s.unstick
	}
	return s.Claimer.Release(ctx, cls, outs)
}
