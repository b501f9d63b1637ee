package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestOnlyATryThatRanOutHoldsTakeovers: the tries that hold this
// claimer's takeovers back (claim.Unanswered) are those the cluster did
// not answer in their time, a stall's. A refusal (a member down, no
// leader) is not: a new leader extends every lease, so none runs out
// across an outage or an election, and noting the calls that met a
// killed member's endpoint held a dead holder's run back for good. A
// caller that gave up (cancelled) says nothing of the cluster. A write
// refused for want of space (NOSPACE) does hold: the cluster answers
// then, but no holder can release.
func TestOnlyATryThatRanOutHoldsTakeovers(t *testing.T) {
	const lease = time.Minute
	live := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, stop := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer stop()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		err    error
		ranOut bool
		held   bool
	}{
		{"answered", live, nil, false, false},
		{"a try that ran out of its time", live, context.DeadlineExceeded, true, true},
		{"the member's own deadline", live, status.Error(codes.Unknown, context.DeadlineExceeded.Error()), true, true},
		{"the caller's deadline, mid-try", expired, context.DeadlineExceeded, true, true},
		{"the caller cancelled", cancelled, context.Canceled, true, false},
		{"a member down", live, status.Error(codes.Unavailable, "connection refused"), false, false},
		{"no leader", live, status.Error(codes.Unknown, proposalDropped), false, false},
		{"an answer that is an error", live, status.Error(codes.InvalidArgument, "bad request"), false, false},
		{"writes refused (NOSPACE)", live, status.Error(codes.ResourceExhausted, "etcdserver: mvcc: database space exceeded"), false, true},
	} {
		var u claim.Unanswered
		noteTry(tc.ctx, &u, tc.err, tc.ranOut, false)
		if got := u.Hold(lease); got != tc.held {
			t.Errorf("%s: takeovers held %v, want %v", tc.name, got, tc.held)
		}
	}
}
