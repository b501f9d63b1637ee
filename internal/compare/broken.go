package compare

import (
	"context"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// broken is a deliberately wrong claim.Claimer: it grants every Claim,
// ignoring leases and holders, always with fence 1 and attempt 1. It exists
// to prove that the harness reports duplicates (and stale writes accepted)
// when a claimer is wrong; the hidden claimer kind "broken" selects it.
type broken struct{ instance string }

func (b *broken) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	return claim.EachRun(runs, func(run claim.Run) (*claim.Claim, error) {
		if err := claim.CheckClaim(run, lease); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		now := time.Now()
		return &claim.Claim{Run: run, Token: claim.NewToken(), Holder: b.instance, Fence: 1, Attempt: 1,
			Deadline: now.Add(lease), Requested: now, Lease: lease}, nil
	})
}

func (b *broken) Renew(_ context.Context, c *claim.Claim, lease time.Duration) error {
	c.Requested, c.Lease = time.Now(), lease
	return nil
}

func (b *broken) Release(_ context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	return make([]error, len(cls))
}

// History remembers nothing: the runner's overlap probe and recovery find
// no runs.
func (b *broken) History(context.Context, string, int) ([]claim.Record, error) { return nil, nil }
func (b *broken) Ping(context.Context) error                                   { return nil }
func (b *broken) Close() error                                                 { return nil }
