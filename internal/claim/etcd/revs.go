package etcd

import (
	"sync"
	"time"
)

// revs remembers, per claim this claimer holds (by token), the mod
// revision of the run's live key as the claimer last wrote it: at the
// grant, and at each renewal. A renewal compares it, so that only the
// latest write of the holder's is renewed.
//
// Why: a renewal grants a new lease and moves the live key onto it, and a
// try of a renewal that a stalled member applies after a later renewal
// has landed would otherwise move the key back onto the earlier lease,
// which expires first. etcd would delete the key, and grant the run to
// another replica, while its holder still trusted the later renewal
// (TestARenewalAppliedLateCannotShortenTheLease). Compared, such a try
// fails and changes nothing.
//
// A claim missing here (granted by another Claimer value, or forgotten
// after its lease ran out) is renewed on its token alone, as before.
type revs struct {
	mu    sync.Mutex
	m     map[string]rev
	prune int // the size at which the next set prunes lapsed entries
}

type rev struct {
	rev   int64
	until time.Time // local, monotonic: past it, no renewal is sent
}

// set records that token's live key was last written at revision r by a
// grant or renewal trusted until until.
func (s *revs) set(token string, r int64, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]rev{}
	}
	s.m[token] = rev{rev: r, until: until}
	// A claim whose holder let it lapse without a release (its process
	// gave up on the backend) is never renewed again: drop such entries
	// once the map has doubled since the last sweep, amortized O(1).
	if len(s.m) >= s.prune {
		now := time.Now()
		for t, e := range s.m {
			if now.After(e.until) {
				delete(s.m, t)
			}
		}
		s.prune = max(2*len(s.m), 64)
	}
}

// get is the revision token's live key was last written at, if known.
func (s *revs) get(token string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[token]
	return e.rev, ok
}

// drop forgets token: its claim was released, or lost.
func (s *revs) drop(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, token)
}
