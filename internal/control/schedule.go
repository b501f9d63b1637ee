package control

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// schedulePrefix keys the schedule a job last ran under:
// schedule/<job>. The runner's drift guard (internal/runner/drift.go)
// writes and reads it.
const schedulePrefix = "schedule/"

// ScheduleTTL is how long a job's schedule entry outlives its last write:
// a weekly job's entry is still there at its next run, and the entry of a
// job removed from the config goes away by itself.
const ScheduleTTL = 7 * 24 * time.Hour

// ScheduleEntry is the version of a job's schedule (spec, time zone,
// jitter) under which a replica last ran one of its instants. During a
// rolling deploy replicas run two versions of a job at once; the entry is
// how each learns of the other (see internal/runner/drift.go). It decides
// nothing: every instant is still claimed under its own run id.
type ScheduleEntry struct {
	Job string `json:"job"`
	// Fingerprint is a short hash of Spec, Timezone and Jitter: equal
	// fingerprints, equal versions.
	Fingerprint string        `json:"fingerprint"`
	Spec        string        `json:"spec"`
	Timezone    string        `json:"timezone"`
	Jitter      time.Duration `json:"jitter"`
	By          string        `json:"by"` // the instance that wrote it
	At          time.Time     `json:"at"` // on the writer's clock
}

// Schedules is every job's schedule entry, by job.
type Schedules map[string]ScheduleEntry

// SetSchedule records e as its job's entry (At defaults to now) and
// returns the entry that stands afterwards: e, or a later write that won.
// The latest write wins, so the entry is the version that ran last.
func (s *Store) SetSchedule(ctx context.Context, e ScheduleEntry) (ScheduleEntry, error) {
	got, errs := s.SetSchedules(ctx, []ScheduleEntry{e})
	return got[0], errs[0]
}

// SetSchedules is SetSchedule for each of es, in one request where the
// register takes batches (claim.PutBatch): a replica that wins thousands
// of runs at one instant records their jobs' versions in a few round
// trips, not one each.
func (s *Store) SetSchedules(ctx context.Context, es []ScheduleEntry) ([]ScheduleEntry, []error) {
	out, errs := make([]ScheduleEntry, len(es)), make([]error, len(es))
	now := s.now()
	var puts []claim.Control
	var idx []int
	for i, e := range es {
		if e.Job == "" {
			errs[i] = fmt.Errorf("%w: schedule entry: empty job name", claim.ErrInvalid)
			continue
		}
		if e.At.IsZero() {
			e.At = now
		}
		e.At = e.At.UTC()
		v, err := json.Marshal(e)
		if err != nil {
			errs[i] = err
			continue
		}
		puts = append(puts, claim.Control{Key: schedulePrefix + e.Job, Value: v, Version: e.At.UnixNano(),
			Expires: now.Add(ScheduleTTL)})
		idx = append(idx, i)
	}
	if len(puts) == 0 {
		return out, errs
	}
	got, perrs := claim.PutBatch(ctx, s.reg, puts)
	for k, i := range idx {
		if errs[i] = perrs[k]; errs[i] == nil {
			errs[i] = json.Unmarshal(got[k].Value, &out[i])
		}
	}
	return out, errs
}

// Schedules reads every job's schedule entry.
func (s *Store) Schedules(ctx context.Context) (Schedules, error) {
	cs, err := s.reg.List(ctx, schedulePrefix)
	if err != nil {
		return nil, err
	}
	snap, err := decode(cs)
	return snap.Schedules, err
}
