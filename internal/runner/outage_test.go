package runner_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
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
