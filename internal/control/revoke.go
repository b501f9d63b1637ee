package control

import (
	"context"
	"encoding/json"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// revokePrefix keys the revocation of a run (revoke/<run id>) by a later
// instant of its job under overlap: replace.
const revokePrefix = "revoke/"

// Revocation asks whichever replica holds a run to stop it: its handler is
// cancelled (the cause is a lease loss) and the run ends skipped, reason
// replaced. A replica that takes the run over later ends it the same way.
type Revocation struct {
	RunID string    `json:"run_id"`
	By    string    `json:"by"` // the run replacing it
	From  string    `json:"from"`
	At    time.Time `json:"at"`
}

// Revoke records that run id is replaced by run by (written from instance
// from), kept for ttl. The first revocation of a run stays.
func (s *Store) Revoke(ctx context.Context, id, by, from string, ttl time.Duration) error {
	now := s.now()
	v, err := json.Marshal(Revocation{RunID: id, By: by, From: from, At: now.UTC()})
	if err != nil {
		return err
	}
	_, err = s.reg.Put(ctx, claim.Control{Key: revokePrefix + id, Value: v, Version: now.UnixNano(),
		First: true, Expires: now.Add(ttl)})
	return err
}
