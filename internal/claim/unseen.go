package claim

import (
	"sync"
	"time"
)

// Unseen remembers, per run, the token of a claimer's last bid whose
// outcome it never heard (its caller gave up, or the answer was lost),
// until that bid's lease would have run out. The bid may have won, and
// its undo may have been lost too, as to a stalled server: then the run
// is held under that token, and the claimer's next claim of the run
// takes the grant (the etcd and postgres claimers) where it would be
// held off by its own ghost for a lease. Only that claimer ever sent the
// token, so a run held under it is a grant nobody runs. (The Redis
// claimers name their bids instead: Bids.)
//
// The zero value is ready to use.
type Unseen struct {
	mu    sync.Mutex
	m     map[string]unseenBid // by run ID
	prune int                  // the size at which the next note prunes lapsed entries
}

type unseenBid struct {
	token string
	until time.Time // local, monotonic: past it, any grant of the bid has expired
}

// Note remembers token's bid for the run with id runID, until until.
func (u *Unseen) Note(runID, token string, until time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[string]unseenBid{}
	}
	u.m[runID] = unseenBid{token: token, until: until}
	// Entries of runs never claimed again would stay for ever: drop the
	// lapsed ones once the map has doubled since the last sweep.
	if len(u.m) >= u.prune {
		now := time.Now()
		for id, e := range u.m {
			if now.After(e.until) {
				delete(u.m, id)
			}
		}
		u.prune = max(2*len(u.m), 64)
	}
}

// Take returns and forgets the token of the unseen bid for the run with
// id runID, if its grant may still be live.
func (u *Unseen) Take(runID string) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	e, ok := u.m[runID]
	delete(u.m, runID)
	return e.token, ok && time.Now().Before(e.until)
}
