package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// minRetention keeps prune from forgetting runs replicas may still claim:
// a forgotten run would be granted again as attempt 1.
const minRetention = 48 * time.Hour

// prune deletes finished runs older than --older-than: the retention story
// for the SQL backends, meant for a daily cron or a Kubernetes CronJob.
func (e *env) prune(args []string) int {
	fs, path := e.flags("prune", "[--config FILE] [--older-than DURATION]")
	older := fs.Duration("older-than", 30*24*time.Hour, "delete finished runs older than `DURATION` (at least 48h)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *older < minRetention {
		fmt.Fprintf(e.stderr, "scheduler prune: --older-than %v: must be at least %v, beyond any misfire grace\n", *older, minRetention)
		return ExitUsage
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, err := openBackend(ctx, cfg, true)
	if err != nil {
		return e.fail("%v", err)
	}
	defer b.Close()
	p, ok := b.Claimer.(claim.Pruner)
	if !ok {
		fmt.Fprintf(e.stdout, "claimer %s expires finished runs by itself; nothing to prune\n", cfg.Claimer.Kind)
		return ExitOK
	}
	n, err := p.Prune(ctx, *older)
	if err != nil {
		return e.fail("prune: %v", err)
	}
	fmt.Fprintf(e.stdout, "pruned %d finished runs older than %v\n", n, *older)
	return ExitOK
}
