package etcd

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// TestRetryEndsWithoutACallersDeadline: each try of a member that does
// not answer runs out its time and is sent again. Under a caller's
// deadline that goes on until the deadline; without one it went on
// forever (the explorer hung on a stalled backend's late request). It now
// stops after six tries, a lease's worth.
func TestRetryEndsWithoutACallersDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const attempt = 100 * time.Millisecond
		tries := 0
		silent := func(ctx context.Context) (int, error) {
			tries++
			<-ctx.Done()
			return 0, ctx.Err()
		}
		start := time.Now()
		if _, err := retry(context.Background(), new(claim.Unanswered), attempt, silent); err == nil {
			t.Fatal("retry against a member that never answers returned no error")
		}
		if tries != 6 || time.Since(start) != 6*attempt {
			t.Fatalf("without a deadline: %d tries in %v, want 6 in %v", tries, time.Since(start), 6*attempt)
		}

		// The deadline falls inside the 21st try: at a try's own end, the
		// two timers fire at one instant, in either order.
		tries = 0
		deadline := 20*attempt + attempt/2
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start = time.Now()
		_, _ = retry(ctx, new(claim.Unanswered), attempt, silent)
		if tries != 21 || time.Since(start) != deadline {
			t.Fatalf("under a deadline of %v: %d tries in %v, want 21, until the deadline", deadline, tries, time.Since(start))
		}
	})
}
