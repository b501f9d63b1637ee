// Package jobs holds the handlers shipped with the scheduler, one file each.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/job"
)

// SleepName is the demo job's name.
const SleepName = "example.sleep"

// SleepParams are example.sleep's params.
type SleepParams struct {
	// Duration is how long a run sleeps ("1s"); default 0.
	Duration time.Duration `yaml:"duration"`
	// FailAttempts makes attempts 1 to FailAttempts of every run
	// (job.Run.Attempt, which counts takeovers too) fail once they have
	// slept, for drills of retries: under `retry: {max_attempts: 3,
	// backoff: 1s}`, fail_attempts 2 fails twice and succeeds on the third
	// attempt, and 3 or more ends the run failed. Default 0: never fail.
	FailAttempts int `yaml:"fail_attempts"`
}

// Validate rejects a negative duration or fail_attempts.
func (p SleepParams) Validate() error {
	var errs []error
	if p.Duration < 0 {
		errs = append(errs, &job.ParamError{Key: "duration", Value: p.Duration.String(), Msg: "must not be negative"})
	}
	if p.FailAttempts < 0 {
		errs = append(errs, &job.ParamError{Key: "fail_attempts", Value: fmt.Sprint(p.FailAttempts), Msg: "must not be negative"})
	}
	return errors.Join(errs...)
}

// ErrSleepFailed is what an attempt of example.sleep that its
// fail_attempts param fails returns, wrapped with the attempt.
var ErrSleepFailed = errors.New("example.sleep: failed as params.fail_attempts asks")

// Sleep logs and sleeps p.Duration: for demos and drills (kill a replica
// mid-run, watch another take over; fail the first attempts, watch the
// retries). Register it with job.RegisterTyped, which declares
// SleepParams.
func Sleep(ctx context.Context, run job.Run, p SleepParams) error {
	run.Logger.InfoContext(ctx, "sleeping", "duration", p.Duration.String())
	t := time.NewTimer(p.Duration)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
	}
	if run.Attempt <= p.FailAttempts {
		return fmt.Errorf("%w (attempt %d of %d)", ErrSleepFailed, run.Attempt, p.FailAttempts)
	}
	return nil
}
