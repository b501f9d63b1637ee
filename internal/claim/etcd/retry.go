package etcd

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// The client spreads calls over the members' connections (gRPC round
// robin) and keeps using a connection until it breaks. A member that
// stalls without closing its connections (a paused process, a hung host,
// a partition that drops packets) is noticed only by gRPC keepalives,
// which gRPC sends no more often than every 10s (it raises a shorter
// DialKeepAliveTime to that) and etcd refuses more often than every 5s:
// meanwhile every call sent to that member waits out its whole deadline,
// though a quorum answers. A renewal or release that waits its whole
// deadline loses the lease, and the run is executed again. So the
// calls a lease depends on give each try a share of the lease, and send
// it again, to the next connection, when that share runs out.
//
// Sending again is safe because every write here compares first: a
// renewal that took effect takes effect again (same token, same lease,
// same record); a release that took effect is recognised by its token
// and outcome in the record; a claim that took effect by its token in the
// live key; a lease grant that took effect only leaves a lease that
// holds nothing and expires.

// attemptTimeout is how long one try of a call made for a lease of d may
// take: a sixth of the lease, so that two stalled tries (a grant and a
// transaction) leave most of a renewal's time, but no less than a slow
// healthy cluster needs and no more than two seconds.
func attemptTimeout(d time.Duration) time.Duration {
	return min(max(d/6, 250*time.Millisecond), 2*time.Second)
}

// timedOut says whether err is a try's deadline that passed on the
// member (which sees the client's deadline): etcd 3.4 answers it as code
// Unknown with the context's text, a moment before the client's own
// deadline would have passed.
func timedOut(err error) bool {
	s, ok := status.FromError(err)
	return ok && (s.Code() == codes.DeadlineExceeded ||
		s.Code() == codes.Unknown && s.Message() == context.DeadlineExceeded.Error())
}

// retry calls f with a context that ends after attempt, or with ctx, and
// again, at once, whenever a try ran out of its time (on the client or
// on the member) before ctx did: the next try goes to the next
// connection. Every try gets the same time: doubled, a second try that
// met the paused leader too spent the rest of a renewal's deadline (the
// pause test, one CI run). It returns the first other outcome; once ctx
// is done, that of the try it ended. A ctx without a deadline gets six
// tries (a lease's worth, as attemptTimeout sizes them): sent with one, a
// call to a cluster that had lost its quorum tried forever (the explorer's
// stalled backend, which applies a request late with its cancellation
// removed, hung two seeds in twenty).
//
// Each try's fate goes to u: a try the cluster did not answer in its
// time (a stall: its members stopped, its disk hung) holds this
// claimer's takeovers back (claim.Unanswered); an answer counts towards
// ending the hold. A try refused at once (a member down, no leader) is
// neither: the cluster was not stalled, and a lease does not run out
// across an outage or an election, since a new leader extends every
// lease (etcd's lessor promotion). Counted as unanswered, the calls that
// met a killed member's endpoint now and then held takeovers back for
// good (the failover test: an orphaned run not taken over in 30s).
func retry[T any](ctx context.Context, h *claim.Unanswered, attempt time.Duration, f func(context.Context) (T, error)) (T, error) {
	_, bounded := ctx.Deadline()
	for tries := 1; ; tries++ {
		actx, cancel := context.WithTimeout(ctx, attempt)
		v, err := f(actx)
		ranOut := err != nil && (actx.Err() != nil || timedOut(err))
		_, grant := any(v).(*clientv3.LeaseGrantResponse)
		noteTry(ctx, h, err, ranOut, grant)
		again := ranOut && ctx.Err() == nil && (bounded || tries < 6)
		cancel()
		if !again {
			return v, err
		}
	}
}

// noteTry tells h of a try that ended in err, ranOut if it ran out of
// its time, sent under ctx, grant if it was a lease grant (see retry).
//
// The cluster's NOSPACE alarm (the quota reached, or raised by an
// operator) refuses every lease grant and every transaction that may
// write, and answers the rest. Such a refusal holds takeovers back: a holder cannot release
// then (a release needs a lease for its done marker), its lease lapses,
// and once the alarm was disarmed a standby's bid, sent more often than
// the holder's retry, ran a finished run again (an outside review: 6 of
// 18 tries). The refusal stands until a grant lands again, which proves
// writes land: etcd 3.4 lets some writes through the alarm (a nested
// transaction's), and counted, their answers would end the hold by its
// chronic cap while grants were still refused (claim.Unanswered.Refused).
func noteTry(ctx context.Context, h *claim.Unanswered, err error, ranOut, grant bool) {
	switch {
	case err == nil && grant:
		h.Landed()
	case err == nil:
		h.Answered()
	case ranOut && !errors.Is(ctx.Err(), context.Canceled):
		h.Note()
	case ranOut || ctx.Err() != nil:
	default:
		switch grpcCode(err) {
		case codes.ResourceExhausted:
			// NOSPACE, or too many requests: writes refused.
			h.Refused(err)
		case codes.Unavailable:
			// refused, not answered (a member down, no leader)
		default:
			h.Answered() // the cluster's answer was an error
		}
	}
}
