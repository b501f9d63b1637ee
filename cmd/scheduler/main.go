// Command scheduler runs cron jobs on replicated deployments, executing each
// scheduled run exactly once across replicas. See README.md.
package main

import (
	"os"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/job"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], job.NewRegistry(), os.Stdout, os.Stderr))
}
