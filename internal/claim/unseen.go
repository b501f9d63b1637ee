package claim

import "time"

// Unseen remembers, per run, the token of a claimer's last bid whose
// outcome it never heard (its caller gave up, or the answer was lost),
// until that bid's lease would have run out. The bid may have won, and
// its undo may have been lost too, as to a stalled server: then the run
// is held under that token, and the claimer's next claim of the run
// takes the grant (the etcd, postgres and sqlite claimers) where it would be
// held off by its own ghost for a lease. Only that claimer ever sent the
// token, so a run held under it is a grant nobody runs. (The Redis
// claimers name their bids instead: Bids.)
//
// The zero value is ready to use.
type Unseen struct{ m Lapsing[string] }

// Note remembers token's bid for the run with id runID, until until.
func (u *Unseen) Note(runID, token string, until time.Time) { u.m.Set(runID, token, until) }

// Take returns and forgets the token of the unseen bid for the run with
// id runID, if its grant may still be live.
func (u *Unseen) Take(runID string) (string, bool) { return u.m.Take(runID) }
