package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// stoppable returns the context of a command that works until it is
// stopped (backfill, trigger, compare, a binary's own commands): the
// first SIGTERM or SIGINT ends it, and the command hands its runs back
// and exits; the second kills the process, as it does a replica's (run).
// An operator who presses Ctrl-C twice wants out now, even while a
// hand-back waits on a backend that does not answer; signal.NotifyContext
// alone kept swallowing every signal after the first. stop releases the
// signals.
func (e *env) stoppable(cmd string) (ctx context.Context, stop func()) {
	return e.stoppableLeaving(cmd, "runs in flight are handed back")
}

// stoppableLeaving is stoppable, saying what the stop leaves (left) in
// its message: a command that holds no run of its own must not say it
// hands runs back.
func (e *env) stoppableLeaving(cmd, left string) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		select {
		case sig := <-sigs:
			signal.Stop(sigs) // default handling again: the next signal kills
			fmt.Fprintf(e.stderr, "scheduler %s: %s: stopping (%s); a second signal exits at once\n", cmd, sig, left)
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(sigs); cancel() }
}
