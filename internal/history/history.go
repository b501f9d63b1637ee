// Package history records what every replica did to every run, and checks
// the record against the guarantees users buy: at most one success per run,
// no new holder while the previous one may still trust its lease, fences
// that grow in grant order, no overlap of a job's runs where overlap is
// forbidden, and no run that fell due silently dropped.
//
// The fault explorer (internal/explore) and `scheduler compare` feed the
// same Log and run the same Check, so staging and CI judge a history by one
// set of rules. Every time in a Log is read on one process's clock, with its
// monotonic reading: the checker compares times across replicas, so every
// replica it judges runs in the recording process (or in a synctest bubble).
package history

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/runner"
)

// Kind is what an Event reports.
type Kind string

// Event kinds.
const (
	// Grant: a claim call returned a claim. Sent is when the request left,
	// At when the reply arrived; the backend granted in between. Until is
	// Sent+lease: the backend's lease cannot end before it.
	Grant Kind = "grant"
	// Renew: a renewal was confirmed. Until is its Sent+lease.
	Renew Kind = "renew"
	// Start and Return bracket a handler's execution (a Return's Status is
	// Succeeded when the handler returned nil); End, after its release,
	// carries the run's Status on that replica.
	Start  Kind = "start"
	Return Kind = "return"
	End    Kind = "end"
	// Release: the backend accepted a release as Status. Sent is when the
	// accepted request left.
	Release Kind = "release"
	// LetGo: a release was sent and not confirmed (refused, a lost reply,
	// no majority): the backend may or may not have ended the claim, but
	// its holder, whose handler had returned, let it go when it was sent.
	LetGo Kind = "let-go"
	// Skip: a replica decided not to execute a run (Reason); Token is set
	// when it held a claim, i.e. the skip was recorded in the backend.
	Skip Kind = "skip"
	// Up, Down and Crash: a replica started, stopped gracefully, or died
	// (after a Crash its handlers count as stopped, whatever else it logs).
	Up    Kind = "up"
	Down  Kind = "down"
	Crash Kind = "crash"
	// Fault: the nemesis did something (Note says what).
	Fault Kind = "fault"
	// Unanswered: a claim call for the run got no answer (an error that
	// is none: a timeout, a reset, the backend unavailable). Sent is when
	// the request left. The backend may have granted it to a caller that
	// never heard, until Until (the reply's time plus the lease; a
	// request that waited in a stalled backend past its caller's giving
	// up may land later still): the run may have been live meanwhile.
	Unanswered Kind = "unanswered"
)

// Event is one fact of a history.
type Event struct {
	Seq     int
	At      time.Time
	Kind    Kind
	Replica string
	Run     claim.Run
	Token   string
	Fence   int64
	Attempt int
	Sent    time.Time
	Until   time.Time
	Status  claim.Status
	Reason  string
	Note    string
	// Ran is, on an End, how long the handler ran: it stopped at
	// the Start's time plus Ran, before its release was settled.
	Ran time.Duration
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s %s", e.Seq, e.Kind, e.Replica)
	if e.Run.Job != "" {
		fmt.Fprintf(&b, " %s", e.Run.ID())
	}
	if e.Token != "" {
		fmt.Fprintf(&b, " fence=%d attempt=%d tok=%.6s", e.Fence, e.Attempt, e.Token)
	}
	for _, kv := range [][2]string{{"status", string(e.Status)}, {"reason", e.Reason}, {"note", e.Note}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s=%s", kv[0], kv[1])
		}
	}
	return b.String()
}

// Log collects events from many goroutines. The zero value is not usable;
// use NewLog.
type Log struct {
	now func() time.Time
	mu  sync.Mutex
	evs []Event
}

// NewLog returns an empty log stamping events with now (default time.Now).
func NewLog(now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{now: now}
}

// Add appends e, stamping At when it is zero.
func (l *Log) Add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.At.IsZero() {
		e.At = l.now()
	}
	e.Seq = len(l.evs) + 1
	l.evs = append(l.evs, e)
}

// Events returns a copy of what was logged so far, in order.
func (l *Log) Events() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.evs...)
}

// Claimed logs a claim call of runs for lease: its grants, and the runs it
// got no answer for (Unanswered). The request left at sent, the reply
// came back now.
func (l *Log) Claimed(replica string, sent time.Time, runs []claim.Run, lease time.Duration, cls []*claim.Claim, errs []error) {
	at := l.now()
	for i, run := range runs {
		var err error
		if i < len(errs) {
			err = errs[i]
		}
		switch {
		case err == nil && i < len(cls) && cls[i] != nil:
			c := cls[i]
			l.Add(Event{At: at, Kind: Grant, Replica: replica, Run: c.Run, Token: c.Token, Fence: c.Fence,
				Attempt: c.Attempt, Sent: c.Requested, Until: c.Requested.Add(c.Lease)})
		case err == nil || errors.Is(err, claim.ErrHeld) || errors.Is(err, claim.ErrDone) || errors.Is(err, claim.ErrInvalid):
			// An answer: granted to another, done, or never sent.
		default:
			l.Add(Event{At: at, Kind: Unanswered, Replica: replica, Run: run, Sent: sent, Until: at.Add(lease)})
		}
	}
}

// Renewed logs a confirmed renewal of c.
func (l *Log) Renewed(replica string, c *claim.Claim) {
	l.Add(Event{Kind: Renew, Replica: replica, Run: c.Run, Token: c.Token, Fence: c.Fence, Attempt: c.Attempt,
		Sent: c.Requested, Until: c.Requested.Add(c.Lease)})
}

// Released logs the accepted releases among cls (errs[i] == nil), and
// the others as let go.
func (l *Log) Released(replica string, sent time.Time, cls []*claim.Claim, outs []claim.Status, errs []error) {
	for i, c := range cls {
		if c == nil || i >= len(errs) || errors.Is(errs[i], claim.ErrInvalid) {
			continue
		}
		kind := Release
		if errs[i] != nil {
			kind = LetGo
		}
		l.Add(Event{Kind: kind, Replica: replica, Run: c.Run, Token: c.Token, Fence: c.Fence,
			Attempt: c.Attempt, Sent: sent, Status: outs[i]})
	}
}

// Observer returns a runner Observe hook that logs replica's run events
// while keep reports true (a crashed replica's late words are not facts).
func (l *Log) Observer(replica string, keep func() bool) func(runner.Event) {
	return func(e runner.Event) {
		if keep != nil && !keep() {
			return
		}
		h := Event{Replica: replica, Run: e.Run}
		if e.Claim != nil {
			h.Token, h.Fence, h.Attempt = e.Claim.Token, e.Claim.Fence, e.Claim.Attempt
		}
		switch e.Kind {
		case runner.EventStarted:
			h.Kind = Start
		case runner.EventReturned:
			h.Kind, h.Ran = Return, e.Ran
			if e.Err == nil {
				h.Status = claim.Succeeded
			}
		case runner.EventFinished:
			h.Kind, h.Status, h.Ran = End, e.Status, e.Ran
			if e.Err != nil {
				h.Note = e.Err.Error()
			}
		case runner.EventSkipped:
			h.Kind, h.Reason = Skip, e.Reason
		default:
			return
		}
		l.Add(h)
	}
}
