package control

import (
	"context"
	"time"
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
