package etcd

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// proposalDropped is raft.ErrProposalDropped's text: a member that has no
// leader, or whose leader is handing over, drops a write without applying
// it, and etcd 3.4 sends that to the client as code Unknown with only this
// message, the one thing to know it by.
const proposalDropped = "raft proposal dropped"

// translate maps an etcd client error onto the claim vocabulary. A done
// ctx is returned as it is (never a sentinel), except that a deadline
// that passed while no endpoint was reachable also says ErrUnavailable:
// the client waits for a connection until the deadline rather than
// failing, so that is how an unreachable cluster shows. Errors that say
// the cluster cannot serve (no leader, a timeout inside it, a member
// stopping, no space, authentication) wrap ErrUnavailable; the rest are
// returned wrapped. etcd's errors never carry the password.
func (c *Claimer) translate(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && c.cli.ActiveConnection().GetState() != connectivity.Ready {
			return errors.Join(fmt.Errorf("%w: no etcd endpoint reachable", claim.ErrUnavailable), ctx.Err())
		}
		return ctx.Err()
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The lease expired before the write that used it arrived.
		return fmt.Errorf("%w: %v: the cluster answered slower than the lease", claim.ErrUnavailable, err)
	}
	switch grpcCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted,
		codes.Aborted, codes.Unauthenticated, codes.PermissionDenied:
		// %v, not %w: a deadline inside the cluster is not the caller's.
		return fmt.Errorf("%w: %v", claim.ErrUnavailable, err)
	}
	return fmt.Errorf("etcd: %w", err)
}

// grpcCode is the gRPC code of err, as the client returns it: an etcd
// error (NOSPACE, say) or a gRPC status; a proposal dropped for want of a
// leader is Unavailable.
func grpcCode(err error) codes.Code {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code()
	}
	if s, ok := status.FromError(err); ok {
		if s.Code() == codes.Unknown && s.Message() == proposalDropped {
			return codes.Unavailable
		}
		return s.Code()
	}
	return codes.Unknown
}
