// Package control gives the operator's controls their meaning: pausing and
// resuming jobs, and requesting a run now. Both are entries of the
// claim.Controls register every backend keeps beside its runs, so a control
// written by the CLI, the HTTP API or the status page reaches every
// replica through the store the fleet already shares, and survives their
// restarts. Neither needs coordination of its own: whatever a replica
// decides from them, the run is still claimed, so it happens once.
package control

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// AllJobs is the job name a pause of every job is recorded under.
const AllJobs = "*"

// Key prefixes in the register.
const (
	pausePrefix   = "pause/"
	requestPrefix = "request/"
	instantPrefix = "instant/" // a requested run's instant, taken
)

// RequestTTL is how long a request is remembered: a retry with the same
// request id within it learns of the first request instead of running the
// job again.
const RequestTTL = 7 * 24 * time.Hour

// Store reads and writes controls through a backend's register.
type Store struct {
	reg claim.Controls
	now func() time.Time
	// version is the version of the last member or unwatched entry
	// written here (nextVersion).
	version atomic.Int64
	// incarnation names this Store in its member entries (Incarnation).
	incarnation string
}

// New returns a Store over reg, stamping writes with now (default
// time.Now).
func New(reg claim.Controls, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{reg: reg, now: now, incarnation: claim.NewToken()[:12]}
}

// Pause is a job's pause switch as last set.
type Pause struct {
	Job    string    `json:"job"` // AllJobs for every job
	Paused bool      `json:"paused"`
	Note   string    `json:"note,omitempty"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	// RequestID is the id of the API call that set it, if any.
	RequestID string `json:"request_id,omitempty"`
}

// SetPause records p (At defaults to now) and returns the switch as it
// stands afterwards: p, or a later one that won.
func (s *Store) SetPause(ctx context.Context, p Pause) (Pause, error) {
	if p.Job == "" {
		return Pause{}, fmt.Errorf("%w: pause: empty job name", claim.ErrInvalid)
	}
	if p.At.IsZero() {
		p.At = s.now()
	}
	p.At = p.At.UTC()
	v, err := json.Marshal(p)
	if err != nil {
		return Pause{}, err
	}
	got, err := s.reg.Put(ctx, claim.Control{Key: pausePrefix + p.Job, Value: v, Version: p.At.UnixNano()})
	if err != nil {
		return Pause{}, err
	}
	var out Pause
	return out, json.Unmarshal(got.Value, &out)
}

// Pauses is every recorded pause switch by job (AllJobs included).
type Pauses map[string]Pause

// Pauses reads every pause switch.
func (s *Store) Pauses(ctx context.Context) (Pauses, error) {
	cs, err := s.reg.List(ctx, pausePrefix)
	if err != nil {
		return nil, err
	}
	snap, err := decode(cs)
	return snap.Pauses, err
}

// Snapshot is what a replica honours of the register, read at once.
type Snapshot struct {
	Pauses   Pauses
	Requests []Request // oldest first
	// Schedules is the schedule each job last ran under (the drift
	// guard's entries); nil if they were not read.
	Schedules Schedules
	// Revoked maps each revoked run's id to the run replacing it
	// (overlap: replace).
	Revoked map[string]string
	// Members are the replicas up, by instance name, sorted (see
	// Announce).
	Members []string
	// Unwatched are the runs processes carry outside the schedule (see
	// Carry), by run id.
	Unwatched []Unwatched
}

// tickPrefixes are the kinds of entry a replica honours every tick. The
// register holds others it must not read that often: the instants
// requests reserved, the failed attempts of retried runs, which a
// flapping job adds by the thousand over their week, and the schedule
// entries, one per job, which the drift guard reads every few ticks.
var tickPrefixes = []string{pausePrefix, requestPrefix, revokePrefix, memberPrefix, unwatchedPrefix}

// Snapshot reads the pause switches, the requests, the revocations, the
// members, the unwatched runs and, with schedules, the schedule entries (nil without), as a
// replica does every tick: in one read (claim.ListPrefixes), so a tick
// costs one round trip of latency, and one walk of the register where the
// backend walks it whole. The schedule entries are most of the register
// when a fleet runs thousands of jobs: a tick without them sends and
// decodes a few entries, not one per job.
func (s *Store) Snapshot(ctx context.Context, schedules bool) (Snapshot, error) {
	prefixes := tickPrefixes
	if schedules {
		prefixes = append(slices.Clone(tickPrefixes), schedulePrefix)
	}
	cs, err := claim.ListPrefixes(ctx, s.reg, prefixes...)
	if err != nil {
		return Snapshot{}, err
	}
	snap, err := decode(cs)
	if !schedules {
		snap.Schedules = nil
	}
	return snap, err
}

// decode reads pauses, requests, schedule entries, revocations and members
// out of register entries, ignoring keys of other kinds (a newer
// version's controls).
func decode(cs []claim.Control) (Snapshot, error) {
	ps := Pauses{}
	var reqs []Request
	scheds := Schedules{}
	revoked := map[string]string{}
	var members []string
	var unwatched []Unwatched
	for _, c := range cs {
		var err error
		switch {
		case strings.HasPrefix(c.Key, pausePrefix):
			var p Pause
			if err = json.Unmarshal(c.Value, &p); err == nil {
				ps[p.Job] = p
			}
		case strings.HasPrefix(c.Key, requestPrefix):
			var r Request
			if err = json.Unmarshal(c.Value, &r); err == nil {
				reqs = append(reqs, r)
			}
		case strings.HasPrefix(c.Key, revokePrefix):
			var v Revocation
			if err = json.Unmarshal(c.Value, &v); err == nil {
				revoked[v.RunID] = v.By
			}
		case strings.HasPrefix(c.Key, schedulePrefix):
			var e ScheduleEntry
			if err = json.Unmarshal(c.Value, &e); err == nil {
				scheds[e.Job] = e
			}
		case strings.HasPrefix(c.Key, memberPrefix):
			members = append(members, strings.TrimPrefix(c.Key, memberPrefix))
		case strings.HasPrefix(c.Key, unwatchedPrefix):
			var u Unwatched
			if err = json.Unmarshal(c.Value, &u); err == nil {
				unwatched = append(unwatched, u)
			}
		}
		if err != nil {
			return Snapshot{}, fmt.Errorf("control %s: %w", c.Key, err)
		}
	}
	slices.SortFunc(reqs, func(a, b Request) int { return a.Created.Compare(b.Created) })
	slices.Sort(members)
	return Snapshot{Pauses: ps, Requests: reqs, Schedules: scheds, Revoked: revoked, Members: members, Unwatched: unwatched}, nil
}

// Of returns the switch that governs job: the later of its own and the
// one for every job, so `pause --all` then `resume JOB` runs JOB, and a
// later `resume --all` resumes everything. ok is false if neither was
// ever set.
func (ps Pauses) Of(job string) (p Pause, ok bool) {
	own, hasOwn := ps[job]
	all, hasAll := ps[AllJobs]
	switch {
	case hasOwn && hasAll:
		if all.At.After(own.At) {
			return all, true
		}
		return own, true
	case hasOwn:
		return own, true
	default:
		return all, hasAll
	}
}

// Paused reports whether job is paused.
func (ps Pauses) Paused(job string) bool {
	p, _ := ps.Of(job)
	return p.Paused
}

// Request asks the fleet to run a job now.
type Request struct {
	// ID is the idempotency key: a request made again with the same ID
	// learns of the first and runs nothing more.
	ID  string `json:"id"`
	Job string `json:"job"`
	// At is the manual run's instant, so its run id is Job@At. It has a
	// sub-second part (see ManualInstant): it never names a scheduled
	// instant.
	At   time.Time `json:"at"`
	Note string    `json:"note,omitempty"`
	By   string    `json:"by"`
	// Overlap is "allow" to run even while an earlier run of the job
	// is live; empty obeys the job's overlap policy.
	Overlap string    `json:"overlap,omitempty"`
	Created time.Time `json:"created"`
}

// Run is the run the request asks for.
func (r Request) Run() claim.Run { return claim.Run{Job: r.Job, At: r.At} }

// ManualInstant is the instant of a run requested at t: t to the
// nanosecond, never a whole second, and at least a microsecond into its
// second. Scheduled instants are whole seconds (cron's finest field) and a
// backfill's reruns an instant plus fewer than a thousand nanoseconds, so
// a requested run shares a run id with neither, and two requests share one
// only if made in the same nanosecond.
func ManualInstant(t time.Time) time.Time {
	at := t.UTC().Round(0)
	if at.Nanosecond() < int(time.Microsecond) {
		at = at.Add(time.Microsecond)
	}
	return at
}

// Manual reports whether run is not a scheduled instant: a run requested
// now, or a backfill's rerun.
func Manual(run claim.Run) bool { return run.At.Nanosecond() != 0 }

// Request records r (ID defaults to a random one; At, Created to now) and
// returns the request that stands under its ID, and whether it is r
// rather than an earlier one.
func (s *Store) Request(ctx context.Context, r Request) (Request, bool, error) {
	if r.Job == "" {
		return Request{}, false, fmt.Errorf("%w: request: empty job name", claim.ErrInvalid)
	}
	now := s.now()
	if r.ID == "" {
		r.ID = claim.NewToken()
	}
	if r.Created.IsZero() {
		r.Created = now
	}
	r.Created = r.Created.UTC()
	if r.At.IsZero() {
		at, err := s.reserve(ctx, r.Job, ManualInstant(r.Created), r.ID, now)
		if err != nil {
			return Request{}, false, err
		}
		r.At = at
	}
	out, err := putFirst(ctx, s, requestPrefix+r.ID, r, r.Created.UnixNano(), now.Add(RequestTTL))
	if err != nil {
		return Request{}, false, err
	}
	return out, out.At.Equal(r.At) && out.Created.Equal(r.Created) && out.Job == r.Job, nil
}

// putFirst stores v, as JSON, under key at version until expires, unless
// the key holds an unexpired entry already (the first one stays), and
// returns the value that stands there.
func putFirst[T any](ctx context.Context, s *Store, key string, v T, version int64, expires time.Time) (T, error) {
	var out T
	b, err := json.Marshal(v)
	if err != nil {
		return out, err
	}
	got, err := s.reg.Put(ctx, claim.Control{Key: key, Value: b, Version: version, First: true, Expires: expires})
	if err != nil {
		return out, err
	}
	err = json.Unmarshal(got.Value, &out)
	return out, err
}

// reserve takes at, or the first free microsecond after it, as the
// instant of request id's run, so that two requests made at one clock
// reading (two hosts, a coarse clock) never share a run id.
func (s *Store) reserve(ctx context.Context, job string, at time.Time, id string, now time.Time) (time.Time, error) {
	for range 1000 {
		key := instantPrefix + claim.Run{Job: job, At: at}.ID()
		got, err := s.reg.Put(ctx, claim.Control{Key: key, Value: []byte(id), Version: now.UnixNano(),
			First: true, Expires: now.Add(RequestTTL)})
		if err != nil {
			return time.Time{}, err
		}
		if string(got.Value) == id {
			return at, nil
		}
		at = at.Add(time.Microsecond)
	}
	return time.Time{}, fmt.Errorf("request %s: no free instant near %s", id, at.Format(time.RFC3339Nano))
}

// Requests lists the remembered requests, oldest first.
func (s *Store) Requests(ctx context.Context) ([]Request, error) {
	cs, err := s.reg.List(ctx, requestPrefix)
	if err != nil {
		return nil, err
	}
	snap, err := decode(cs)
	return snap.Requests, err
}

// Identity is the default "by" of a control: user@host.
func Identity() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return strings.TrimSpace(name) + "@" + host
}
