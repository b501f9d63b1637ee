package control

import (
	"context"
	"encoding/json"
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
	v, err := json.Marshal(b)
	if err != nil {
		return Backfill{}, false, err
	}
	got, err := s.reg.Put(ctx, claim.Control{Key: backfillPrefix + b.RequestID, Value: v, Version: b.Created.UnixNano(),
		First: true, Expires: now.Add(RequestTTL)})
	if err != nil {
		return Backfill{}, false, err
	}
	var out Backfill
	if err := json.Unmarshal(got.Value, &out); err != nil {
		return Backfill{}, false, err
	}
	return out, out.ID == b.ID && out.Replica == b.Replica, nil
}
