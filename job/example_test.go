package job_test

import (
	"context"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/job"
)

type reportParams struct {
	Window time.Duration `yaml:"window"` // "1h"
	Format string        `yaml:"format"`
}

// Validate, optional, runs after decoding; a *job.ParamError names the key.
func (p reportParams) Validate() error {
	if p.Window <= 0 {
		return &job.ParamError{Key: "window", Value: p.Window.String(), Msg: "must be positive"}
	}
	return nil
}

// A handler declares its params as a struct; commands check a job's params
// against it before anything runs.
func ExampleRegisterTyped() {
	reg := job.NewRegistry()
	job.MustRegisterTyped(reg, "reports.hourly", func(ctx context.Context, run job.Run, p reportParams) error {
		run.Logger.InfoContext(ctx, "building report", "window", p.Window.String(), "format", p.Format)
		return nil
	})
	fmt.Println(reg.CheckParams("reports.hourly", job.Params{"window": "1h", "format": "csv"}))
	fmt.Println(reg.CheckParams("reports.hourly", job.Params{"window": "forever"}))
	fmt.Println(reg.CheckParams("reports.hourly", job.Params{"window": "-1h"}))
	fmt.Println(reg.CheckParams("reports.hourly", job.Params{"window": "1h", "fromat": "csv"}))
	// Output:
	// <nil>
	// jobs.reports.hourly.params.window: "forever": want a duration such as "1s"
	// jobs.reports.hourly.params.window: "-1h0m0s": must be positive
	// jobs.reports.hourly.params.fromat: unknown key; want one of format, window
}
