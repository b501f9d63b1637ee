package etcd

import (
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
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
type revs struct{ m claim.Lapsing[int64] }

// set records that token's live key was last written at revision r by a
// grant or renewal trusted until until (local, monotonic: past it, no
// renewal is sent, and the entry may be swept).
func (s *revs) set(token string, r int64, until time.Time) { s.m.Set(token, r, until) }

// get is the revision token's live key was last written at, if known.
func (s *revs) get(token string) (int64, bool) { return s.m.Get(token) }

// drop forgets token: its claim was released, or lost.
func (s *revs) drop(token string) { s.m.Drop(token) }
