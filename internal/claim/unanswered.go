package claim

import (
	"sync/atomic"
	"time"
)

// Unanswered remembers when a backend last left a call of this claimer
// unanswered (unavailable, or the caller's deadline came first), so that
// for a lease after it the claimer does not take over a lapsed lease.
//
// A backend that stalls (a SIGSTOP, a long GC or script, CLIENT PAUSE,
// another process holding SQLite's write lock) lets every lease lapse
// while no holder can renew or release. When it resumes, the bids that
// waited in it, or came first, took over runs whose handlers had
// returned, their releases not yet landed, and ran them again (an
// outside review: 286–297 of 300 runs after a 6–15s Redis stop, 37 of
// 60 on SQLite). A holder retries its release until the backend
// answers; the hold gives it a lease to land. A holder that died
// meanwhile is taken over that much later: the price of not telling a
// stall from every holder dying at once. A claimer that sent nothing
// during the stall until its bid for the lapsed lease does not know to
// hold back. The zero value is ready to use.
type Unanswered struct {
	last atomic.Int64 // monotonic ns since epoch; 0: never
}

// epoch is the origin of Unanswered's monotonic readings.
var epoch = time.Now()

// Note records that a call went unanswered now.
func (u *Unanswered) Note() { u.last.Store(max(int64(time.Since(epoch)), 1)) }

// Within reports whether a call went unanswered within the last d.
func (u *Unanswered) Within(d time.Duration) bool {
	l := u.last.Load()
	return l != 0 && time.Since(epoch)-time.Duration(l) < d
}
