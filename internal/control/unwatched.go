package control

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// unwatchedPrefix keys each run a process executes that no replica
// dispatched (unwatched/<run id>/<holder>): a backfill's, a `trigger
// --here`'s. One entry per holder: a backfill run again, bidding for a run
// the first one was granted, must not overwrite the entry that says so (a
// replica that read only the bid would take the run over under the job's
// overlap policy, and skip for good a run a backfill started; found by the
// explorer, seed 7202).
// Nothing on any replica's schedule leads to such a run, and a backfill's
// instant may sit behind any number of later runs of its job, deeper than
// the history the sweep reads. So its holder names it here while it
// carries it, renewing the entry with its lease; killed, it leaves the
// entry to expire, and every replica that reads it in the meantime stands
// by for the run and takes it over once its lease lapses.
const unwatchedPrefix = "unwatched/"

// Unwatched is the entry of one run a process carries outside the
// schedule.
type Unwatched struct {
	Job    string    `json:"job"`
	At     time.Time `json:"at"` // the run's instant
	Holder string    `json:"holder"`
	// Since is when its holder first bid for it, on the holder's clock.
	Since time.Time `json:"since"`
	// Granted says its holder was granted the run; until then, the entry
	// names a bid that may or may not be granted.
	Granted bool `json:"granted,omitempty"`
	// Ends marks the run ended here: the entry only says it need not be
	// watched, until it expires.
	Ends bool `json:"ends,omitempty"`
	// Alongside says the run executes beside live runs of its job,
	// whatever the job's overlap policy (a backfill's run, a trigger
	// --here with --overlap allow); so does a replica that takes it
	// over. Under the policy, a takeover of a backfill's run next to a
	// live scheduled run would be skipped, and the instant, recorded
	// skipped, never run: a backfill run again keeps it.
	Alongside bool `json:"alongside,omitempty"`
}

// Run returns the run u names.
func (u Unwatched) Run() claim.Run { return claim.Run{Job: u.Job, At: u.At} }

// Carry records that u.Holder bids for (or, Granted, carries) u's run,
// until ttl from now. A holder calls it before its first bid for the run
// and again with each renewal.
func (s *Store) Carry(ctx context.Context, u Unwatched, ttl time.Duration) error {
	u.Ends = false
	return s.putUnwatched(ctx, u, ttl)
}

// Ended withdraws u: its run ended here (succeeded, failed, skipped), so
// no replica need stand by for it. The entry that says so outlives the
// holder's last Carry, so that a late renewal cannot bring the run back.
func (s *Store) Ended(ctx context.Context, u Unwatched, ttl time.Duration) error {
	u.Ends = true
	return s.putUnwatched(ctx, u, ttl)
}

func (s *Store) putUnwatched(ctx context.Context, u Unwatched, ttl time.Duration) error {
	if u.Job == "" || u.At.IsZero() {
		return fmt.Errorf("%w: unwatched run %q at %v", claim.ErrInvalid, u.Job, u.At)
	}
	u.At, u.Since = u.At.UTC(), u.Since.UTC()
	v, err := json.Marshal(u)
	if err != nil {
		return err
	}
	now := s.now()
	_, err = s.reg.Put(ctx, claim.Control{Key: unwatchedPrefix + u.Run().ID() + "/" + u.Holder, Value: v,
		Version: s.nextVersion(now), Expires: now.Add(ttl)})
	return err
}
