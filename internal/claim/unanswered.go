package claim

import (
	"sync/atomic"
	"time"
)

// Unanswered remembers when a backend last left a call of this claimer
// unanswered (unavailable, or the caller's deadline came first), so that
// until the backend has answered again for a lease the claimer does not
// take over a lapsed lease.
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
// hold back, unless it is new: a new one starts held (Start).
//
// The hold has a cap. A backend that keeps leaving a call unanswered
// now and then while it answers the others (chronically overloaded, or
// behind a link that drops a connection every few seconds) is not
// stalled, and holding on would keep a dead holder's run from ever being
// taken over. So once the backend has answered for ChronicAfter leases
// of one streak (unanswered calls less than a lease apart; answers are
// counted a lease apart, so a long stall inside the streak counts as
// none), the hold ends until a lease passes with every call answered. A
// stall that starts inside such a streak gets no hold.
//
// A backend that refuses writes (a full disk, a database switched
// read-only, a quota reached) answers, but no holder can release: the
// claimer says so with Refused, and Landed once a write lands again.
// Until then no other answer counts: the statements that write nothing
// (a bid for a run held or done, a read) still succeed, and counted as
// answers, they ended the hold by its cap while every write was still
// refused, and a standby took over a finished run the moment writes
// landed again, before its holder's retried release (outside reviews,
// docs/hardening.md entries 36–38: SQLite on a full disk, PostgreSQL on
// disk_full, etcd's NOSPACE alarm).
//
// The zero value is ready to use; a claimer calls Start as it is made.
type Unanswered struct {
	last     atomic.Int64            // the latest unanswered call; 0: never
	since    atomic.Int64            // the first answer after it; 0: none yet
	answered atomic.Int64            // the streak's first answer; 0: none yet
	counted  atomic.Int64            // the streak's latest answer counted in answers
	answers  atomic.Int64            // the streak's answers at least a lease apart
	lease    atomic.Int64            // the latest Hold's lease, which bounds a streak
	refused  atomic.Pointer[refusal] // the latest refused write, until one lands
}

// refusal is a write the backend refused, and when.
type refusal struct {
	err error
	at  time.Time
}

// TakeoverWait is how long a bid may wait, from its send to the
// backend's handling of it, and still take over a lapsed lease: a
// quarter of it. A bid that waited longer (in a stopped server, behind a
// lock, on a slow link) may have overtaken a release its holder sent
// into the same wait, and its claimer holds takeovers back after it as
// after a call unanswered: the lapsed lease may be a stall's, not a dead
// holder's. Every claimer that can take a lapsed lease over checks it:
// the backend against the bid's send (SQLite, Redis), or against the
// first step of a bid in two (PostgreSQL).
func TakeoverWait(lease time.Duration) time.Duration { return lease / 4 }

// ChronicAfter is how many leases of answers within one streak of
// unanswered calls end the hold.
const ChronicAfter = 3

// epoch is the origin of Unanswered's monotonic readings.
var epoch = time.Now()

// sinceEpoch is now on Unanswered's monotonic scale, never 0.
func sinceEpoch() int64 { return max(int64(time.Since(epoch)), 1) }

// Note records that a call went unanswered now.
func (u *Unanswered) Note() { u.noteAt(sinceEpoch()) }

// Answered records that the backend answered a call now, one that
// wrote nothing or whose writes are unknown. While a refusal stands
// (Refused, and no Landed since), it counts for nothing.
func (u *Unanswered) Answered() { u.answeredAt(sinceEpoch()) }

// Refused records that the backend refused a write now, with err: a call
// unanswered, as Note, and no answer counts until a write lands.
func (u *Unanswered) Refused(err error) { u.refusedAt(err, sinceEpoch()) }

// Landed records that a write landed now: the backend answered, and a
// refusal is over.
func (u *Unanswered) Landed() { u.landedAt(sinceEpoch()) }

// Refusal returns the error of the latest refused write if it came
// within d and no write landed since. Readiness reports it: a probe that
// writes nothing, or rewrites one row, passes on a full disk.
func (u *Unanswered) Refusal(d time.Duration) error {
	if r := u.refused.Load(); r != nil && time.Since(r.at) < d {
		return r.err
	}
	return nil
}

// Hold reports whether a takeover of a lapsed lease is to be held back
// now: a call went unanswered, and the backend has not answered for a
// lease since (nor answered at all: a stall may last longer than a
// lease after the last call that went unanswered in it), and the streak
// has not yet had answers across ChronicAfter leases.
func (u *Unanswered) Hold(lease time.Duration) bool { return u.holdAt(lease, sinceEpoch()) }

// Start holds takeovers back from now until the backend has answered
// for a lease, as after a call unanswered now. Every claimer that holds
// takeovers calls it as it is made: a new process does not know whether
// the backend has just left the calls of the processes before it
// unanswered. Begun inside a stall (a pod restarted while its probes
// failed on the stalled backend), its first calls wait there and are
// answered as the stall ends, none unanswered, and its bid, sent next,
// took over a lapsed lease whose holder's release, sent into the stall,
// had not landed yet: the run ran twice (the explorer's seed 31001563, a
// backfill begun inside a stall). The price: a deployment restarted all
// at once takes its dead predecessors' runs over a lease after its first
// answer, rather than as their leases lapse.
func (u *Unanswered) Start() { u.noteAt(sinceEpoch()) }

// Settle forgets the hold Start began (and any other): for a test whose
// claimers stand for processes that have been up, and answered, for
// longer than the leases it bids with.
func (u *Unanswered) Settle() {
	u.last.Store(0)
	u.since.Store(0)
	u.answered.Store(0)
	u.counted.Store(0)
	u.answers.Store(0)
	u.refused.Store(nil)
}

// StartAt, NoteAt, AnsweredAt and HoldAt are Start, Note, Answered and
// Hold at t, for a caller that keeps time on a clock of its own (a
// simulation's, whose clock does not run on the process's monotonic one).
// A value is used with these or with the others, not both.
func (u *Unanswered) StartAt(t time.Time)    { u.noteAt(max(t.UnixNano(), 1)) }
func (u *Unanswered) NoteAt(t time.Time)     { u.noteAt(max(t.UnixNano(), 1)) }
func (u *Unanswered) AnsweredAt(t time.Time) { u.answeredAt(max(t.UnixNano(), 1)) }
func (u *Unanswered) HoldAt(lease time.Duration, t time.Time) bool {
	return u.holdAt(lease, max(t.UnixNano(), 1))
}

// ChronicAt reports whether, at t, the hold is off only for its cap: the
// current streak of unanswered calls has had answers across ChronicAfter
// leases (a harness that judges takeovers tells these from the held).
func (u *Unanswered) ChronicAt(lease time.Duration, t time.Time) bool {
	d, now := int64(lease), max(t.UnixNano(), 1)
	if u.last.Load() == 0 {
		return false
	}
	if s := u.since.Load(); s != 0 && now-s >= d {
		return false
	}
	return u.answered.Load() != 0 && u.answers.Load() > ChronicAfter
}

func (u *Unanswered) noteAt(t int64) {
	prev := u.last.Swap(t)
	u.since.Store(0)
	if d := u.lease.Load(); prev == 0 || d > 0 && t-prev >= d {
		u.answered.Store(0) // a new streak
	}
}

func (u *Unanswered) refusedAt(err error, t int64) {
	u.refused.Store(&refusal{err: err, at: time.Now()})
	u.noteAt(t)
}

func (u *Unanswered) landedAt(t int64) {
	u.refused.Store(nil)
	u.answeredAt(t)
}

func (u *Unanswered) answeredAt(t int64) {
	l := u.last.Load()
	if l == 0 || u.refused.Load() != nil {
		return
	}
	u.since.CompareAndSwap(0, t)
	if t-l < u.lease.Load() {
		if u.answered.CompareAndSwap(0, t) {
			u.counted.Store(t)
			u.answers.Store(1)
		} else if c := u.counted.Load(); t-c >= u.lease.Load() && u.counted.CompareAndSwap(c, t) {
			u.answers.Add(1)
		}
	}
}

func (u *Unanswered) holdAt(lease time.Duration, t int64) bool {
	d := int64(lease)
	u.lease.Store(d)
	if u.last.Load() == 0 {
		return false
	}
	if s := u.since.Load(); s != 0 && t-s >= d {
		return false // the backend has answered for a lease
	}
	// Chronic is answers in lease after lease, not time since the first
	// one: a short stall and, within a lease of its end, a long one (a
	// failover after a hiccup) are one streak with one answer in it, and
	// the long stall's hold is whole.
	return u.answered.Load() == 0 || u.answers.Load() <= ChronicAfter
}
