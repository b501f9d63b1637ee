package compare

import (
	"errors"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
)

// grant is one successful Claim call as the harness saw it, and what became
// of it. Times are local, with monotonic readings.
type grant struct {
	seq     int // order in which the harness received grants
	run     claim.Run
	id      string
	replica string
	token   string
	fence   int64
	attempt int
	granted time.Time // the Claim reply arrived
	// confirmed is claim.Claim.Requested after the latest successful Claim
	// or Renew: the backend's lease runs at least lease from there.
	confirmed time.Time
	lease     time.Duration
	// released is when an accepted Release was sent, with its outcome.
	released time.Time
	outcome  claim.Status

	started, finished time.Time
	status            claim.Status
	completed         bool // the handler returned nil: the run's work got done
}

// validUntil is the earliest moment another grant of the same run can be
// legitimate: never after a terminal release was accepted, otherwise when the
// confirmed lease expires or the run was handed back.
func (g *grant) validUntil() time.Time {
	if g.outcome.Terminal() {
		return time.Unix(1<<40, 0)
	}
	v := g.confirmed.Add(g.lease)
	if !g.released.IsZero() && g.released.Before(v) {
		v = g.released
	}
	return v
}

// FaultEvent is one fault applied during a cell, for the report.
type FaultEvent struct {
	Kind       string  `json:"kind"`
	Replica    string  `json:"replica,omitempty"`
	AtMS       float64 `json:"at_ms"` // since the cell started
	DurationMS float64 `json:"duration_ms,omitempty"`
	Note       string  `json:"note,omitempty"`
}

// recorder collects everything one cell's replicas did. It is safe for
// concurrent use; the runner calls observe synchronously.
//
// log is the same record in the form the history checker reads (the
// fault explorer's ledger, internal/history): the faulty wrapper feeds it
// every grant, renewal and release, the runners' Observe hook every start,
// return, end and skip. analyze runs history.Check on it beside compare's
// own counts.
type recorder struct {
	t0  time.Time
	log *history.Log

	mu        sync.Mutex
	seq       int
	grants    map[string]*grant // by token
	latest    map[string]*grant // by run id + "|" + replica: the handler's own grant
	runs      map[string]bool   // run ids ever claimed
	calls     int
	claimLat  []time.Duration
	faults    []FaultEvent
	leaseSeen int             // handlers that saw ErrLeaseLost after a rejected write
	lags      []time.Duration // how late the harness's own probe timer fired
	crashedAt map[string]time.Time
	// lossUntil is, per replica, the end of the latest data-loss guard
	// its claimer told it of.
	lossUntil map[string]time.Time
}

func newRecorder(t0 time.Time) *recorder {
	return &recorder{t0: t0, log: history.NewLog(nil), grants: map[string]*grant{}, latest: map[string]*grant{},
		runs: map[string]bool{}, crashedAt: map[string]time.Time{}, lossUntil: map[string]time.Time{}}
}

func (r *recorder) call() {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
}

// claimed records one Claim call, or one ClaimBatch call for several runs
// (one call, one latency sample, a grant per run won).
func (r *recorder) claimed(replica string, runs []claim.Run, start, end time.Time, cls []*claim.Claim, errs []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.claimLat = append(r.claimLat, end.Sub(start))
	for i, run := range runs {
		r.runs[run.ID()] = true
		var loss *claim.DataLossError
		if i < len(errs) && errors.As(errs[i], &loss) && loss.Until.After(r.lossUntil[replica]) {
			r.lossUntil[replica] = loss.Until
		}
		if i >= len(cls) || cls[i] == nil || (i < len(errs) && errs[i] != nil) {
			continue
		}
		cl := cls[i]
		r.seq++
		g := &grant{seq: r.seq, run: cl.Run, id: cl.ID(), replica: replica, token: cl.Token, fence: cl.Fence,
			attempt: cl.Attempt, granted: end, confirmed: cl.Requested, lease: cl.Lease}
		if g.confirmed.IsZero() {
			g.confirmed = start
		}
		r.grants[g.token] = g
		r.latest[g.id+"|"+replica] = g
	}
}

func (r *recorder) renewed(c *claim.Claim, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if g := r.grants[c.Token]; g != nil && err == nil {
		g.confirmed, g.lease = c.Requested, c.Lease
	}
}

func (r *recorder) released(cls []*claim.Claim, outs []claim.Status, sent time.Time, errs []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	for i, c := range cls {
		if g := r.grants[c.Token]; g != nil && errs[i] == nil {
			g.released, g.outcome = sent, outs[i]
		}
	}
}

// observe is the runners' Observe hook.
func (r *recorder) observe(e runner.Event) {
	if e.Claim == nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.grants[e.Claim.Token]
	if g == nil {
		return
	}
	switch e.Kind {
	case runner.EventStarted:
		g.started = now
	case runner.EventFinished:
		g.finished, g.status = now, e.Status
	}
}

// grantOf returns the grant a replica's handler runs under.
func (r *recorder) grantOf(replica, runID string) *grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.latest[runID+"|"+replica]
}

// completed marks the replica's grant of runID as having done its work.
func (r *recorder) completed(replica, runID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g := r.latest[runID+"|"+replica]; g != nil {
		g.completed = true
	}
}

func (r *recorder) fault(kind, replica string, at time.Time, d time.Duration, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, FaultEvent{Kind: kind, Replica: replica, AtMS: ms(at.Sub(r.t0)),
		DurationMS: ms(d), Note: note})
	if kind == FaultCrash {
		r.crashedAt[replica] = at
	}
}

func (r *recorder) lag(d time.Duration) {
	r.mu.Lock()
	r.lags = append(r.lags, d)
	r.mu.Unlock()
}

func (r *recorder) sawLeaseLost() {
	r.mu.Lock()
	r.leaseSeen++
	r.mu.Unlock()
}

// ms converts a duration to milliseconds, rounded to microseconds.
func ms(d time.Duration) float64 {
	return float64(d.Round(time.Microsecond)) / float64(time.Millisecond)
}
