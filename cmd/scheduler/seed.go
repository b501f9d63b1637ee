package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/internal/jobs/billing"
)

// seed creates demo customers and their usage for the last --days UTC days
// up to today in the configured database, so that billing.nightly, or
// `scheduler trigger billing.nightly` (which bills yesterday), has something
// to invoice.
var seed = cli.Command{
	Name:     "seed",
	Synopsis: "[--config FILE] [--customers N] [--days N]",
	Summary:  "demo customers and usage for billing.nightly",
	Setup: func(fs *flag.FlagSet) cli.Action {
		customers := fs.Int("customers", 100, "create `N` demo customers")
		days := fs.Int("days", 7, "usage for the last `N` days, today included (UTC)")
		return func(ctx context.Context, in cli.Invocation) error {
			if len(in.Args) > 0 {
				return cli.Usagef("unexpected argument %q", in.Args[0])
			}
			if *customers < 1 || *days < 1 {
				return cli.Usagef("--customers and --days must be at least 1")
			}
			// Connecting and migrating a healthy database takes well under this.
			openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			s, err := billing.Open(openCtx, billing.Options{Database: in.Resources.Database})
			cancel()
			if err != nil {
				return err
			}
			defer s.Close()
			today := billing.Day(time.Now())
			periods := make([]billing.Period, *days)
			for i := range periods {
				periods[i] = billing.Day(today.Start.AddDate(0, 0, i-*days+1))
			}
			if err := s.Seed(ctx, *customers, periods...); err != nil {
				return fmt.Errorf("seed: %w", err)
			}
			fmt.Fprintf(in.Stdout, "seeded %d customers with usage from %s to %s in %s\n",
				*customers, periods[0], periods[len(periods)-1], in.Resources.Database)
			return nil
		}
	},
}
