// Package jobs holds the handlers shipped with the scheduler, one file each.
package jobs

import (
	"context"
	"time"

	"github.com/scheduler-dev/scheduler/job"
)

// SleepName is the demo job's name.
const SleepName = "example.sleep"

// Sleep logs and sleeps params.duration (default 0): for demos and drills
// (kill a replica mid-run, watch another take over).
func Sleep(ctx context.Context, run job.Run) error {
	d, err := run.Params.Duration("duration", 0)
	if err != nil {
		return err
	}
	run.Logger.InfoContext(ctx, "sleeping", "duration", d.String())
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
