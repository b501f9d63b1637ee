package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/internal/config"
)

// pruneFloor is the least --older-than whatever the config says: prune
// often runs from a CronJob with a config of its own, which may not list
// every job, or every grace, that the replicas run.
const pruneFloor = 48 * time.Hour

// prune deletes finished runs older than --older-than: the retention story
// for the SQL backends, meant for a daily cron or a Kubernetes CronJob. It
// refuses an age at which a replica could still claim a run (see
// config.ClaimWindow): a forgotten run would be granted again as attempt 1.
func (e *env) prune(args []string) int {
	fs, path := e.flags("prune", "[--config FILE] [--older-than DURATION]")
	older := fs.Duration("older-than", 30*24*time.Hour,
		"delete finished runs older than `DURATION` (at least 48h, and every job's claim window)")
	if code, ok := e.parseNoArgs(fs, args); !ok {
		return code
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	if err := checkPruneAge(cfg, *older); err != nil {
		fmt.Fprintf(e.stderr, "scheduler prune: --older-than %v: %v\n", *older, err)
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, err := openExisting(ctx, cfg)
	if err != nil {
		return e.fail("%v", err)
	}
	defer b.Close()
	if b.Pruner == nil {
		fmt.Fprintf(e.stdout, "claimer %s expires finished runs by itself; nothing to prune\n", cfg.Claimer.Kind)
		return ExitOK
	}
	n, err := b.Pruner.Prune(ctx, *older)
	if err != nil {
		return e.fail("prune: %v", err)
	}
	fmt.Fprintf(e.stdout, "pruned %d finished runs older than %v\n", n, *older)
	return ExitOK
}

// checkPruneAge refuses an age below the config's MinRetention (naming the
// job that needs more) or below the floor.
func checkPruneAge(cfg *config.Config, older time.Duration) error {
	// The floor first: below it no config helps, and naming the config's
	// smaller bound first sent an operator round twice (outside review).
	if older < pruneFloor {
		return fmt.Errorf("must be at least %v whatever the config says: the replicas may run jobs, or a misfire grace, that this config lacks", pruneFloor)
	}
	return cfg.CheckRetention(older)
}
