package web

import (
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
)

// Run is one run as GET /api/runs, the status page and `scheduler runs`
// show it. The backend's record keeps only the latest attempt; beside it
// are the failed attempts the control store remembers (jobs that retry
// record them, for 7 days), the retry pending if any, and when the run
// was due to start under its job's jitter.
type Run struct {
	claim.Record
	// MaxAttempts is the job's max_attempts; 0 when the job is not
	// configured here.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// StartsAt is when the run was due to start: its instant plus the
	// job's jitter. Nil for jobs without jitter and for manual runs,
	// which start when asked.
	StartsAt *time.Time `json:"starts_at"`
	// Attempts are the run's recorded failed attempts, oldest first.
	Attempts []control.Attempt `json:"attempts"`
	// RetryPending is the next attempt while one is due; nil otherwise.
	RetryPending *Retry `json:"retry_pending"`
}

// Retry is a retry pending: attempt Attempt of the run is due at At.
type Retry struct {
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
}

// Runs describes recs. attempts may hold other runs' attempts too (a
// whole job's, or every job's): they are ignored. jobs gives each job's
// jitter and max_attempts; runs of jobs missing from it show neither.
func Runs(recs []claim.Record, attempts []control.Attempt, jobs []JobInfo) []Run {
	byRun := control.AttemptsByRun(attempts)
	byName := make(map[string]JobInfo, len(jobs))
	for _, j := range jobs {
		byName[j.Name] = j
	}
	out := make([]Run, 0, len(recs))
	for _, rec := range recs {
		r := Run{Record: rec, Attempts: byRun[rec.RunID]}
		if r.Attempts == nil {
			r.Attempts = []control.Attempt{}
		}
		if j, ok := byName[rec.Job]; ok {
			r.MaxAttempts = j.MaxAttempts
			r.StartsAt = timePtr(j.start(rec.At))
		}
		r.RetryPending = retryPending(rec, r.Attempts)
		out = append(out, r)
	}
	return out
}

// retryPending is the retry rec waits for. A holder whose attempt failed
// and is retried leaves the run running, records the attempt with the
// time the next may start, and cuts its lease to end then; the next
// attempt takes the run over once the lease lapsed. So a retry is pending
// while the record is running and its latest attempt is recorded failed
// with a retry time. It is due when the lease lapses, if later than the
// time recorded: a holder that could not cut its lease leaves it to lapse
// at its last deadline.
func retryPending(rec claim.Record, attempts []control.Attempt) *Retry {
	if rec.Status != claim.Running {
		return nil
	}
	for _, a := range attempts {
		if a.Attempt == rec.Attempt && !a.RetryAt.IsZero() {
			return &Retry{Attempt: rec.Attempt + 1, At: later(a.RetryAt, rec.LeaseUntil).UTC()}
		}
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// start is when j's run at starts: at plus j's jitter (the runner's own
// computation); zero when j has no jitter or the run is manual.
func (j JobInfo) start(at time.Time) time.Time {
	if j.Jitter <= 0 || j.Parsed == nil || control.Manual(claim.Run{Job: j.Name, At: at}) {
		return time.Time{}
	}
	return j.Parsed.Jittered(j.Name, at, j.Jitter)
}
