// Package jobs holds the handlers shipped with the scheduler, one file each.
package jobs

import (
	"context"
	"time"

	"github.com/scheduler-dev/scheduler/job"
)

// SleepName is the demo job's name.
const SleepName = "example.sleep"

// SleepParams are example.sleep's params.
type SleepParams struct {
	// Duration is how long a run sleeps ("1s"); default 0.
	Duration time.Duration `yaml:"duration"`
}

// Validate rejects a negative duration.
func (p SleepParams) Validate() error {
	if p.Duration < 0 {
		return &job.ParamError{Key: "duration", Value: p.Duration.String(), Msg: "must not be negative"}
	}
	return nil
}

// Sleep logs and sleeps p.Duration: for demos and drills (kill a replica
// mid-run, watch another take over). Register it with job.RegisterTyped,
// which declares SleepParams.
func Sleep(ctx context.Context, run job.Run, p SleepParams) error {
	run.Logger.InfoContext(ctx, "sleeping", "duration", p.Duration.String())
	t := time.NewTimer(p.Duration)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
