// Package memory is an in-process Claimer for tests and single-replica use.
// Replicas that share one *Claimer coordinate; separate processes do not.
package memory

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Options configure a Claimer.
type Options struct {
	// Instance is the holder id written into claims.
	Instance string
	// Now is the clock leases are measured on; default time.Now.
	Now func() time.Time
}

type entry struct {
	rec   claim.Record
	token string
}

// Store is the shared state several in-process replicas coordinate through.
type Store struct {
	mu     sync.Mutex
	runs   map[string]*entry
	fences map[string]int64
	// controls is the operator's state (see Controls).
	controls map[string]claim.Control
	now      func() time.Time
	lag      func() time.Duration // see StampLag
	pages    bool                 // see GrantPages
}

// GrantPages makes every grant of a call that asks for pages
// (claim.WithPages) carry its job's page (claim.Claim.Page), read under
// the lock the grant is made under, as the Redis claimer's script reads
// it in the grant's own step; without it, the runner reads the page after
// the grant, as over PostgreSQL. Call it before the store is used. Each
// such grant scans the store: for tests and the explorer.
func (s *Store) GrantPages() { s.pages = true }

// StampLag makes the store behave as a backend that stamps a claim when
// its statement starts and executes it later, as PostgreSQL does (now()
// is the transaction's start; the fence and the row come when the insert
// runs): each claim call is stamped on arrival, then waits lag() before
// it takes effect under that stamp, so a grant can be stamped before a
// grant made (and seen) ahead of it. Leases and expiry are measured from
// the stamp, as PostgreSQL measures them from now(). Call it before the
// store is used; tests of runners use it.
func (s *Store) StampLag(lag func() time.Duration) { s.lag = lag }

// NewStore returns an empty store measuring leases on now (default time.Now).
func NewStore(now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{runs: map[string]*entry{}, fences: map[string]int64{}, now: now}
}

// Claimer is one replica's view of a Store.
type Claimer struct {
	s        *Store
	instance string
}

// New returns a Claimer for instance over s.
func New(s *Store, instance string) *Claimer {
	if s == nil {
		panic("memory: nil store")
	}
	return &Claimer{s: s, instance: instance}
}

// Claim implements claim.Claimer, run by run under one lock.
func (m *Claimer) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	return m.ClaimHolding(ctx, runs, lease, false)
}

// ClaimHolding is Claim; with hold, it takes no lapsed lease over (the
// run is reported held), as the networked claimers do while their
// backend has lately left calls unanswered (claim.Unanswered). The memory
// store itself never stalls; the explorer, which stalls and cuts off its
// replicas' view of it, keeps that record for them.
func (m *Claimer) ClaimHolding(ctx context.Context, runs []claim.Run, lease time.Duration, hold bool) ([]*claim.Claim, []error) {
	claims := make([]*claim.Claim, len(runs))
	errs, valid := claim.CheckClaimBatch(ctx, runs, lease)
	requested := time.Now()
	// Grants are stamped under the lock, so in the order they are made;
	// under StampLag, on arrival, before the statement's wait.
	var stamp time.Time
	if m.s.lag != nil {
		stamp = m.s.now()
		time.Sleep(m.s.lag()) // the statement waits before it runs (StampLag)
	}
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	if stamp.IsZero() {
		stamp = m.s.now()
	}
	pages := m.s.pages && claim.PagesWanted(ctx)
	for _, i := range valid {
		claims[i], errs[i] = m.claim(runs[i], lease, requested, stamp, hold, pages)
	}
	return claims, errs
}

// claim grants one run at now (with hold, not a lapsed lease; with
// pages, with its page). m.s.mu must be held.
func (m *Claimer) claim(run claim.Run, lease time.Duration, requested, now time.Time, hold, pages bool) (*claim.Claim, error) {
	s := m.s
	id := run.ID()
	e := s.runs[id]
	attempt := 1
	if e != nil {
		switch {
		case !e.rec.Status.Live():
			return nil, fmt.Errorf("claim %s: %w", id, claim.ErrDone)
		case e.rec.Status == claim.Running && (hold || now.Before(e.rec.LeaseUntil)):
			return nil, fmt.Errorf("claim %s: %w", id, claim.ErrHeld)
		}
		attempt = e.rec.Attempt + 1
	}
	s.fences[run.Job]++
	c := &claim.Claim{
		Run: claim.Run{Job: run.Job, At: run.At.UTC()}, Token: claim.NewToken(), Holder: m.instance,
		Fence: s.fences[run.Job], Attempt: attempt, Deadline: now.Add(lease),
		Requested: requested, Lease: lease,
	}
	s.runs[id] = &entry{token: c.Token, rec: claim.Record{
		RunID: id, Job: run.Job, At: c.Run.At, Status: claim.Running,
		Holder: m.instance, Fence: c.Fence, Attempt: attempt, StartedAt: now, LeaseUntil: c.Deadline,
	}}
	if pages {
		c.Page = s.page(run.Job)
	}
	return c, nil
}

// page is the newest claim.PageSize records of job, as History answers.
// s.mu must be held.
func (s *Store) page(job string) []claim.Record {
	var recs []claim.Record
	for _, e := range s.runs {
		if e.rec.Job == job {
			recs = append(recs, e.rec)
		}
	}
	slices.SortFunc(recs, func(a, b claim.Record) int { return b.At.Compare(a.At) })
	return slices.Clone(recs[:min(len(recs), claim.PageSize)])
}

// live returns the entry c holds, or ErrLeaseLost. s.mu must be held.
func (s *Store) live(c *claim.Claim) (*entry, error) {
	e := s.runs[c.ID()]
	if e == nil || e.token != c.Token || e.rec.Status != claim.Running {
		return nil, fmt.Errorf("claim %s: %w", c.ID(), claim.ErrLeaseLost)
	}
	return e, nil
}

// Renew implements claim.Claimer.
func (m *Claimer) Renew(ctx context.Context, c *claim.Claim, lease time.Duration) error {
	if err := claim.CheckRenew(c, lease); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	requested := time.Now()
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.live(c)
	if err != nil {
		return err
	}
	now := s.now()
	if !now.Before(e.rec.LeaseUntil) {
		return fmt.Errorf("renew %s: expired: %w", c.ID(), claim.ErrLeaseLost)
	}
	e.rec.LeaseUntil = now.Add(lease)
	c.Deadline, c.Requested, c.Lease = e.rec.LeaseUntil, requested, lease
	return nil
}

// Release implements claim.Claimer, claim by claim under one lock.
func (m *Claimer) Release(ctx context.Context, cls []*claim.Claim, outcomes []claim.Status) []error {
	errs, valid := claim.CheckReleaseBatch(cls, outcomes)
	if err := ctx.Err(); err != nil {
		for _, i := range valid {
			errs[i] = err
		}
		return errs
	}
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	for _, i := range valid {
		errs[i] = m.release(cls[i], outcomes[i])
	}
	return errs
}

// release ends one claim. m.s.mu must be held.
func (m *Claimer) release(c *claim.Claim, o claim.Status) error {
	s := m.s
	if e := s.runs[c.ID()]; e != nil && e.token == c.Token && e.rec.Status == o {
		return nil // a retry of a release that took effect
	}
	e, err := s.live(c)
	if err != nil {
		return err
	}
	e.rec.Status = o
	if o.Terminal() {
		e.rec.FinishedAt = s.now()
	}
	return nil
}

// Ping implements claim.Claimer; memory is always reachable.
func (m *Claimer) Ping(ctx context.Context) error { return ctx.Err() }

// Close implements claim.Claimer.
func (m *Claimer) Close() error { return nil }

// History implements claim.Claimer.
func (m *Claimer) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	if job == "" {
		return m.records(ctx, nil, limit)
	}
	hists, err := m.Histories(ctx, []claim.HistoryQuery{{Job: job, Limit: limit}})
	if err != nil {
		return nil, err
	}
	return hists[0], nil
}

var _ claim.Historian = (*Claimer)(nil)

// Histories implements claim.Historian: one pass over the store, under
// one lock, for every query.
func (m *Claimer) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	at := make(map[string][]int, len(qs))
	for i, q := range qs {
		at[q.Job] = append(at[q.Job], i)
	}
	hists := make([][]claim.Record, len(qs))
	all, err := m.records(ctx, at, 0)
	if err != nil {
		return nil, err
	}
	for _, r := range all { // newest first, so each list is too
		for _, i := range at[r.Job] {
			if qs[i].Limit <= 0 || len(hists[i]) < qs[i].Limit {
				hists[i] = append(hists[i], r)
			}
		}
	}
	return hists, nil
}

// records lists the runs of jobs (nil: every job), newest scheduled
// instant first, then by job, at most limit (<= 0: all).
func (m *Claimer) records(ctx context.Context, jobs map[string][]int, limit int) ([]claim.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.s.mu.Lock()
	var out []claim.Record
	for _, e := range m.s.runs {
		if _, ok := jobs[e.rec.Job]; jobs == nil || ok {
			out = append(out, e.rec)
		}
	}
	m.s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].At.Equal(out[j].At) {
			return out[i].At.After(out[j].At)
		}
		return out[i].Job < out[j].Job
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Controls is the store's register of operator state (claim.Controls).
func (s *Store) Controls() claim.Controls { return controls{s} }

type controls struct{ s *Store }

// Put implements claim.Controls.
func (c controls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	if err := claim.CheckControl(ctx, e); err != nil {
		return claim.Control{}, err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.controls == nil {
		s.controls = map[string]claim.Control{}
	}
	stored, ok := s.controls[e.Key]
	if ok && !stored.Expired(s.now()) && !e.Wins(stored) {
		return stored, nil
	}
	e.Value = slices.Clone(e.Value)
	s.controls[e.Key] = e
	return e, nil
}

// List implements claim.Controls.
func (c controls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []claim.Control
	now := s.now()
	for k, e := range s.controls {
		if strings.HasPrefix(k, prefix) && !e.Expired(now) {
			e.Value = slices.Clone(e.Value)
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b claim.Control) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}
