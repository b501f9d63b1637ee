// Command scheduler runs cron jobs on replicated deployments, executing each
// scheduled run exactly once across replicas. See README.md.
//
// It is the scheduler's command line (package cli) with the shipped jobs,
// example.sleep and billing.nightly, and seed, demo data for the latter. A
// team's own binary is built the same way, with its own jobs.
package main

import (
	"os"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/internal/jobs"
	"github.com/scheduler-dev/scheduler/internal/jobs/billing"
	"github.com/scheduler-dev/scheduler/job"
)

func main() {
	reg := job.NewRegistry()
	job.MustRegisterTyped(reg, jobs.SleepName, jobs.Sleep)
	// billing.nightly needs the configured database: the commands that
	// execute it open it through billing.Opener. Its params are declared
	// here, as they are checked without opening it.
	reg.MustRegisterOpener(billing.JobName, billing.Opener, job.WithParams[billing.Params]())
	os.Exit(cli.Main(os.Args[1:], reg, os.Stdout, os.Stderr, seed))
}
