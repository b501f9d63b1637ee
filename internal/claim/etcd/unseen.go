package etcd

import (
	"sync"
	"time"
)

// unseen remembers, per run, the token of this claimer's last bid whose
// outcome it never heard (its caller gave up, or the answer was lost),
// until that bid's lease would have run out. The bid may have won, and
// its undo (undoLater) may have been lost too, as to a stalled cluster:
// then the run's live key holds that token, and the next claim of the
// run by this claimer takes the grant over (an adopting bid) where it
// would be held off by its own ghost for a lease. Only this claimer
// ever wrote that token, so a live key holding it is a grant nobody else
// trusts.
type unseen struct {
	mu    sync.Mutex
	m     map[string]unseenBid // by run ID
	prune int                  // the size at which the next note prunes lapsed entries
}

type unseenBid struct {
	token string
	until time.Time // local, monotonic: past it, any grant of the bid has expired
}

// note remembers token's bid for run, until until.
func (u *unseen) note(runID, token string, until time.Time) {
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

// take returns and forgets the token of run's unseen bid, if its grant
// may still be live.
func (u *unseen) take(runID string) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	e, ok := u.m[runID]
	delete(u.m, runID)
	return e.token, ok && time.Now().Before(e.until)
}
