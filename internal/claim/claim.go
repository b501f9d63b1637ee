// Package claim defines the contract between the runner and the coordination
// backends: a Claimer grants at most one replica the right to execute one
// scheduled run. The package holds no backend code; backends live in
// sub-packages and import this one.
package claim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Callers test them with errors.Is and never import a
// backend to do so.
var (
	// ErrHeld means another replica holds a live claim on the run. It is a
	// normal outcome of a lost bid, not a failure.
	ErrHeld = errors.New("claim: held by another replica")
	// ErrDone means the run already finished (succeeded, failed or skipped) and must
	// not execute again.
	ErrDone = errors.New("claim: run already done")
	// ErrLeaseLost means the caller's claim is no longer valid: it expired,
	// was taken over, or was released.
	ErrLeaseLost = errors.New("claim: lease lost")
	// ErrUnavailable means the backend could not be reached or did not answer
	// in time. The runner fails closed on it: nothing runs unclaimed.
	ErrUnavailable = errors.New("claim: backend unavailable")
	// ErrInvalid means the caller passed bad input (empty job name, zero
	// instant, non-positive lease).
	ErrInvalid = errors.New("claim: invalid argument")
)

// DataLossError rides along with ErrHeld when the backend was found to have
// lost its data (a Redis server restarted empty): it no longer knows who
// holds what, so it holds every run until Until, a lease after it noticed,
// by which time every holder from before the loss has stood down. Runs are
// not lost by it; an operator should still hear of it, since the done
// markers of finished runs went too.
type DataLossError struct {
	Backend string // what lost its data, e.g. the server's address
	Until   time.Time
	// Detail, when set, says how the loss was seen and what it leaves
	// behind (an etcd cluster's fences restarting lower).
	Detail string
}

// LossWatcher is a Claimer that can find a data loss outside a claim (a
// watcher of the backend's marker, say): a loss that no claim met while
// it held runs was neither logged nor counted. The runner passes report,
// which it calls for each loss it finds, as a claim held for one would
// report it; report may be called from any goroutine.
type LossWatcher interface {
	WatchLoss(report func(*DataLossError))
}

// TakeoverHolder is a Claimer that holds takeovers of lapsed leases back
// after its backend left calls unanswered (Unanswered). TakeoversHeld
// reports whether it does now, for leases of lease: the runner logs the
// hold's start and end and exports it, so that an operator sees why a
// dead holder's runs wait after a stall rather than only the lag.
type TakeoverHolder interface {
	TakeoversHeld(lease time.Duration) bool
}

// Settler is a TakeoverHolder that starts with takeovers held
// (Unanswered.Start) and can be told to end that hold: a test's claimers
// stand for replicas that have been up, and answered, for longer than the
// leases the test bids with. Nothing outside tests calls Settle.
type Settler interface {
	Settle()
}

// HeldBy is c's TakeoversHeld, false for a claimer that holds none: what
// a wrapper of a claimer (a fault injector, a recorder) passes on, since
// embedding the Claimer interface alone hides the method.
func HeldBy(c Claimer, lease time.Duration) bool {
	th, ok := c.(TakeoverHolder)
	return ok && th.TakeoversHeld(lease)
}

// WatchLossOf is c's WatchLoss, nothing for a claimer that watches none
// (see HeldBy).
func WatchLossOf(c Claimer, report func(*DataLossError)) {
	if lw, ok := c.(LossWatcher); ok {
		lw.WatchLoss(report)
	}
}

func (e *DataLossError) Error() string {
	s := fmt.Sprintf("claim: %s lost its data; every run is held until %s",
		e.Backend, e.Until.UTC().Format(time.RFC3339Nano))
	if e.Detail != "" {
		s += "; " + e.Detail
	}
	return s
}

// Run names one firing of a job. At comes from the job's schedule, never from
// a replica's clock, so every replica names the same run the same way.
type Run struct {
	Job string
	At  time.Time
}

// ID is the run's deterministic identifier, identical on every replica:
// the job name, "@", and the instant in UTC (RFC 3339 with nanoseconds).
// The instant's text never contains "@", so splitting at the last "@"
// recovers the pair: distinct runs never share an ID.
func (r Run) ID() string {
	return r.Job + "@" + r.At.UTC().Format(time.RFC3339Nano)
}

// ParseID is the inverse of Run.ID.
func ParseID(id string) (Run, error) {
	i := strings.LastIndexByte(id, '@')
	if i <= 0 {
		return Run{}, fmt.Errorf("%w: run id %q has no job@instant form", ErrInvalid, id)
	}
	at, err := time.Parse(time.RFC3339Nano, id[i+1:])
	if err != nil {
		return Run{}, fmt.Errorf("%w: run id %q: %v", ErrInvalid, id, err)
	}
	return Run{Job: id[:i], At: at.UTC()}, nil
}

// Validate reports bad input before any backend is asked.
func (r Run) Validate() error {
	switch {
	case r.Job == "":
		return fmt.Errorf("%w: empty job name", ErrInvalid)
	case r.At.IsZero():
		return fmt.Errorf("%w: job %q: zero scheduled instant", ErrInvalid, r.Job)
	}
	return nil
}

// ValidateLease rejects a lease a backend could not honour.
func ValidateLease(lease time.Duration) error {
	if lease < time.Millisecond {
		return fmt.Errorf("%w: lease %v must be at least 1ms", ErrInvalid, lease)
	}
	return nil
}

// Claim is the right to execute one run, held until its lease deadline unless
// renewed. Every mutation a backend performs on behalf of a Claim compares
// Token first, so a stale holder can never act on its successor's claim.
type Claim struct {
	Run   Run
	Token string // random, unique per grant
	// Holder is the instance id of the replica that holds the claim.
	Holder string
	// Fence grows strictly with every grant for the same job (takeovers
	// included) and survives a restart of the backend. Side effects carry it
	// so fenced storage can reject a stale holder.
	Fence int64
	// Attempt is 1 for the first grant of a run and grows by one with every
	// takeover.
	Attempt int
	// Deadline is the lease deadline as the backend computed it, on the
	// backend's clock. It is informational: the runner trusts its own
	// monotonic window (see TrustedUntil), never a comparison of clocks.
	Deadline time.Time
	// Requested is the local time, with its monotonic reading, at which the
	// request that granted or last renewed the claim was sent. The backend
	// started the lease no earlier than that, so Requested+lease bounds
	// the lease from below whatever the clocks say.
	Requested time.Time
	// Lease is the duration granted by the last claim or renewal.
	Lease time.Duration
	// Page, when the claimer sets it, is the newest PageSize records of
	// the run's job, as History(job, PageSize) would have answered at
	// the grant: this grant's own record among them, read in the same
	// atomic step as the grant (one Redis script, one lock held). It is
	// the overlap probe's first read without a round trip of its own:
	// the runner judges the page's leases as of the grant, and reads
	// afresh for every later look. Only a call whose ctx asks for pages
	// (WithPages) gets them, where the backend can give them: a backend
	// whose grant and read are not one step (a PostgreSQL statement
	// reads a snapshot that a concurrent grant can commit past) leaves
	// it nil, and the runner reads the page after the grant.
	Page []Record
}

// PageSize is how many records a grant's Page holds at most: the number
// the runner's overlap probe reads first.
const PageSize = 16

type pagesKey struct{}

// WithPages returns ctx asking the claimer to hand each grant of a Claim
// call made with it its job's page (Claim.Page). It is a hint: the page
// costs the backend a read of up to PageSize records a grant, which only
// a caller that probes for overlaps saves, and a claimer may ignore it.
// Merged calls (Coalescer) go with one caller's values.
func WithPages(ctx context.Context) context.Context {
	return context.WithValue(ctx, pagesKey{}, true)
}

// PagesWanted reports whether ctx asks for pages (WithPages).
func PagesWanted(ctx context.Context) bool {
	on, _ := ctx.Value(pagesKey{}).(bool)
	return on
}

// ID is the run id of the claimed run.
func (c *Claim) ID() string { return c.Run.ID() }

// TrustedUntil is the local monotonic instant after which the holder must
// assume the lease is gone, margin before the earliest possible expiry.
func (c *Claim) TrustedUntil(margin time.Duration) time.Time {
	return c.Requested.Add(c.Lease - margin)
}

// Claimer grants at most one replica the right to execute a scheduled run.
//
// It is batch-first: Claim and Release take many runs and answer each on
// its own, because that is how the runner calls them (every run due at one
// instant, every release queued behind the one in flight) and what lets a
// backend answer 10,000 runs in a few round trips. ClaimOne and ReleaseOne
// ask for a single run.
//
// Implementations are safe for concurrent use. They do not retry, back off
// or keep leases alive on their own: that is written once, in the runner.
// Every method honours ctx and returns promptly once it is done; a
// cancellation is returned as ctx's error, never mapped onto a sentinel.
type Claimer interface {
	// Claim tries once to win each of runs for lease, and returns one
	// result per run, in order: claims[i] is the grant of runs[i], or nil
	// with errs[i] saying why. It grants a fresh run with attempt 1, and
	// takes over a run whose holder released it as Interrupted or whose
	// lease has expired (on the backend's clock) with attempt+1 and a
	// higher fence. errs[i] is ErrHeld if another replica holds a live
	// claim, ErrDone if the run finished, ErrInvalid for bad input (that
	// run alone), or a backend or ctx failure for every run it affected.
	// Runs must be distinct.
	Claim(ctx context.Context, runs []Run, lease time.Duration) (claims []*Claim, errs []error)
	// Renew extends c's lease to lease from now (backend time) and updates
	// c. It returns ErrLeaseLost if c is no longer the live claim on its run,
	// including when its lease already expired.
	Renew(ctx context.Context, c *Claim, lease time.Duration) error
	// Release ends each of claims with outcomes[i] and returns one error
	// per claim, in order. errs[i] is ErrLeaseLost if the claim is no
	// longer the claim on its run (someone took over) or was already
	// released with another outcome, ErrInvalid for bad input, or a backend
	// or ctx failure for every claim it affected (those may or may not have
	// been released). Releasing again with the outcome a claim was released
	// with succeeds and changes nothing: a caller that lost the reply to a
	// release that took effect retries it, and must not be told it lost the
	// run it just finished. Claims must be of distinct runs.
	Release(ctx context.Context, claims []*Claim, outcomes []Status) []error
	// History lists recorded runs, newest scheduled instant first; job ""
	// means every job. The runner reads it to decide overlap and to find
	// live runs at start-up; the CLI and status page show it.
	History(ctx context.Context, job string, limit int) ([]Record, error)
	// Ping reports whether the backend is reachable and takes claims now
	// (ErrUnavailable if not): readiness. A Redis that answers PING but
	// refuses writes is not.
	Ping(ctx context.Context) error
	// Close frees the claimer's resources. It does not release claims.
	Close() error
}

// ClaimOne asks c for a single run.
func ClaimOne(ctx context.Context, c Claimer, run Run, lease time.Duration) (*Claim, error) {
	cls, errs := c.Claim(ctx, []Run{run}, lease)
	return cls[0], errs[0]
}

// ReleaseOne ends a single claim with outcome o.
func ReleaseOne(ctx context.Context, c Claimer, cl *Claim, o Status) error {
	return c.Release(ctx, []*Claim{cl}, []Status{o})[0]
}

// EachRun answers a Claim batch run by run with f, for claimers and
// decorators that decide each run on its own.
func EachRun(runs []Run, f func(Run) (*Claim, error)) ([]*Claim, []error) {
	claims, errs := make([]*Claim, len(runs)), make([]error, len(runs))
	for i, run := range runs {
		claims[i], errs[i] = f(run)
	}
	return claims, errs
}

// EachClaim answers a Release batch claim by claim with f.
func EachClaim(claims []*Claim, outcomes []Status, f func(*Claim, Status) error) []error {
	errs := make([]error, len(claims))
	for i, c := range claims {
		if i < len(outcomes) {
			errs[i] = f(c, outcomes[i])
		} else {
			errs[i] = fmt.Errorf("%w: no outcome for claim %d", ErrInvalid, i)
		}
	}
	return errs
}

// Status is how a run stands, or how it ended: one vocabulary for what a
// backend records, what a holder releases a run as, and what the runner's
// events, logs and metrics, and the explorer's history, report.
type Status string

const (
	// Running and Interrupted are the live states a backend records.
	Running Status = "running"
	// Interrupted hands the run back: another replica may take it over at
	// once, with attempt+1 and a higher fence, without waiting for the
	// lease.
	Interrupted Status = "interrupted"

	// Succeeded, Failed, Skipped and Missed are terminal: the run is done
	// and is never granted again. Skipped means it was deliberately not
	// executed (an overlap, a paused job); Missed that it passed its
	// deadline before any replica could start it (none was up, the
	// backend was out of reach, the replica holding it fell behind).
	Succeeded Status = "succeeded"
	Failed    Status = "failed"
	Skipped   Status = "skipped"
	Missed    Status = "missed"

	// LeaseLost, Timeout and Retrying are ends a replica reports and no
	// backend records: a run whose lease was lost is not released by its
	// former holder (the new holder decides), one that timed out is
	// released as Failed, and an attempt that failed and is retried is
	// not released at all: its lease is cut to lapse after the backoff,
	// and the next attempt takes the run over.
	LeaseLost Status = "lease_lost"
	Timeout   Status = "timeout"
	Retrying  Status = "retrying"
)

// Live reports whether a run a backend records in status s may still
// execute.
func (s Status) Live() bool { return s == Running || s == Interrupted }

// Terminal reports whether s ends the run for good.
func (s Status) Terminal() bool {
	return s == Succeeded || s == Failed || s == Skipped || s == Missed
}

// Releasable reports whether a holder may release a run as s.
func (s Status) Releasable() bool { return s.Terminal() || s == Interrupted }

// Record is one run as a backend remembers it, for history and status pages.
type Record struct {
	RunID      string    `json:"run_id"`
	Job        string    `json:"job"`
	At         time.Time `json:"scheduled_at"`
	Status     Status    `json:"status"`
	Holder     string    `json:"holder"`
	Fence      int64     `json:"fence"`
	Attempt    int       `json:"attempt"`
	StartedAt  time.Time `json:"started_at"`
	LeaseUntil time.Time `json:"lease_until"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// Pruner is what the SQL backends offer besides the Claimer: they keep
// finished runs until told to forget them. The opener hands it out as a
// capability, nil for backends that expire runs on their own. Prune deletes succeeded, failed and
// skipped runs that finished more than olderThan ago, on the backend's
// clock, and returns how many. Live and interrupted runs are kept: their
// attempt count must survive. A pruned run could be granted again as
// attempt 1, so retention must exceed any window in which replicas still
// claim past runs.
type Pruner interface {
	Prune(ctx context.Context, olderThan time.Duration) (int64, error)
}

// HistoryQuery asks for the newest Limit runs of Job (Limit <= 0: all
// that are kept), as History(ctx, Job, Limit) would.
type HistoryQuery struct {
	Job   string
	Limit int
}

// Historian is what a backend offers that reads the recent runs of many
// jobs in one round trip. The runner reads a job's history before every
// execution it admits (the overlap probe) and for every job at start-up;
// with 10,000 runs due at one instant, one read per job would be most of
// its work. Histories answers qs[i] in hists[i] exactly as History(ctx,
// qs[i].Job, qs[i].Limit) would at some instant after the call began;
// Job must not be "". It fails as a whole: a backend that cannot answer
// every query answers none. Decorators that wrap a Claimer forward it
// with Histories below, so that wrapping never loses it.
type Historian interface {
	Histories(ctx context.Context, qs []HistoryQuery) (hists [][]Record, err error)
}

// Histories reads qs from c: in one call where c is a Historian, job by
// job where it is not.
func Histories(ctx context.Context, c Claimer, qs []HistoryQuery) ([][]Record, error) {
	for _, q := range qs {
		if q.Job == "" {
			return nil, fmt.Errorf("%w: history query without a job", ErrInvalid)
		}
	}
	if h, ok := c.(Historian); ok {
		return h.Histories(ctx, qs)
	}
	hists := make([][]Record, len(qs))
	for i, q := range qs {
		recs, err := c.History(ctx, q.Job, q.Limit)
		if err != nil {
			return nil, err
		}
		hists[i] = recs
	}
	return hists, nil
}

// NewToken returns a random 128-bit token in hex.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// CheckRelease validates a Release call's arguments.
func CheckRelease(c *Claim, o Status) error {
	if c == nil || c.Token == "" {
		return fmt.Errorf("%w: nil claim", ErrInvalid)
	}
	if !o.Releasable() {
		return fmt.Errorf("%w: unknown outcome %q", ErrInvalid, o)
	}
	return nil
}

// CheckReleaseBatch validates a ReleaseBatch call's arguments: errs holds
// CheckRelease's answer for each claim, valid the indexes of those that
// passed.
func CheckReleaseBatch(cls []*Claim, outcomes []Status) (errs []error, valid []int) {
	errs = make([]error, len(cls))
	for i, c := range cls {
		if i >= len(outcomes) {
			errs[i] = fmt.Errorf("%w: no outcome for claim %d", ErrInvalid, i)
		} else if errs[i] = CheckRelease(c, outcomes[i]); errs[i] == nil {
			valid = append(valid, i)
		}
	}
	return errs, valid
}

// CheckClaimBatch validates a ClaimBatch call's arguments: errs holds
// CheckClaim's answer for each run, or ctx's error once ctx is done; valid
// holds the indexes of the runs that passed.
func CheckClaimBatch(ctx context.Context, runs []Run, lease time.Duration) (errs []error, valid []int) {
	errs = make([]error, len(runs))
	for i, run := range runs {
		if errs[i] = CheckClaim(run, lease); errs[i] == nil {
			if errs[i] = ctx.Err(); errs[i] == nil {
				valid = append(valid, i)
			}
		}
	}
	return errs, valid
}

// CheckClaim validates a Claim call's arguments.
func CheckClaim(run Run, lease time.Duration) error {
	if err := run.Validate(); err != nil {
		return err
	}
	return ValidateLease(lease)
}

// CheckRenew validates a Renew call's arguments.
func CheckRenew(c *Claim, lease time.Duration) error {
	if c == nil || c.Token == "" {
		return fmt.Errorf("%w: nil claim", ErrInvalid)
	}
	return ValidateLease(lease)
}
