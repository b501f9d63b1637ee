package control

import (
	"context"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// backfillPrefix keys a backfill started through the HTTP API under its
// caller's request id (backfill/<request id>).
const backfillPrefix = "backfill/"

// Backfill is a backfill started under a request id: where it runs, so
// that a retry of the call, on any replica, finds it instead of starting
// the range again (under rerun all or failed, a second backfill would run
// every instant again).
type Backfill struct {
	RequestID string    `json:"request_id"`
	ID        string    `json:"id"` // the backfill's id on Replica
	Replica   string    `json:"replica"`
	Job       string    `json:"job"`
	Created   time.Time `json:"created"`
}

// StartBackfill records b under its request id, unless a backfill is
// recorded there already (for RequestTTL), and returns the one that
// stands and whether it is b.
func (s *Store) StartBackfill(ctx context.Context, b Backfill) (Backfill, bool, error) {
	now := s.now()
	if b.Created.IsZero() {
		b.Created = now.UTC()
	}
	out, err := putFirst(ctx, s, backfillPrefix+b.RequestID, b, b.Created.UnixNano(), now.Add(RequestTTL))
	if err != nil {
		return Backfill{}, false, err
	}
	return out, out.ID == b.ID && out.Replica == b.Replica, nil
}

// backfillStatePrefix keys the state of a backfill started through the
// HTTP API, under its id (backfillstate/<id>), as the replica running it
// last wrote it.
const backfillStatePrefix = "backfillstate/"

// BackfillStateTTL is how long a backfill's state is kept after its last
// write: every replica's API answers for it that long, where the replica
// that ran it keeps only its last few in memory.
const BackfillStateTTL = 24 * time.Hour

// PublishBackfill records state (a JSON document) as backfill id's state
// at at; a write stamped earlier than the one stored changes nothing.
func (s *Store) PublishBackfill(ctx context.Context, id string, state []byte, at time.Time) error {
	_, err := s.reg.Put(ctx, claim.Control{Key: backfillStatePrefix + id, Value: state, Version: at.UnixNano(),
		Expires: s.now().Add(BackfillStateTTL)})
	return err
}

// BackfillState returns the state last published for backfill id, or
// false if none is kept.
func (s *Store) BackfillState(ctx context.Context, id string) ([]byte, bool, error) {
	cs, err := s.reg.List(ctx, backfillStatePrefix+id)
	if err != nil {
		return nil, false, err
	}
	for _, c := range cs {
		if c.Key == backfillStatePrefix+id {
			return c.Value, true, nil
		}
	}
	return nil, false, nil
}
