package control

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// attemptPrefix keys the record of a failed attempt of a run that retries
// (see Attempt): attempt/<run id>/<attempt, zero-padded>.
const attemptPrefix = "attempt/"

// AttemptTTL is how long a failed attempt is remembered: the week an
// operator may take to ask why Monday's run needed three tries.
const AttemptTTL = 7 * 24 * time.Hour

// Attempt is one failed attempt of a run whose job retries: the backend's
// run record keeps only the latest attempt, so each attempt that failed
// is recorded here by the replica that ran it, and the history of a run
// reads them back beside its record.
type Attempt struct {
	RunID   string       `json:"run_id"`
	Attempt int          `json:"attempt"`
	Fence   int64        `json:"fence"`
	Holder  string       `json:"holder"`
	Status  claim.Status `json:"status"` // failed or timeout
	Error   string       `json:"error,omitempty"`
	Started time.Time    `json:"started_at"`
	Ended   time.Time    `json:"ended_at"`
	// RetryAt is when the next attempt may start (the holder's lease was
	// cut to end then); zero when the attempts were spent and the run
	// ended failed.
	RetryAt time.Time `json:"retry_at,omitzero"`
}

// maxAttemptError bounds the error text kept per attempt: a handler that
// fails with a megabyte of stack must not fill the register.
const maxAttemptError = 1024

// RecordAttempt stores a. Each attempt is written once, by its holder: a
// repeat of the write (a retried call) keeps the first.
func (s *Store) RecordAttempt(ctx context.Context, a Attempt) error {
	if a.RunID == "" || a.Attempt < 1 {
		return fmt.Errorf("%w: attempt %d of run %q", claim.ErrInvalid, a.Attempt, a.RunID)
	}
	if len(a.Error) > maxAttemptError {
		a.Error = a.Error[:maxAttemptError] + "…"
	}
	v, err := json.Marshal(a)
	if err != nil {
		return err
	}
	now := s.now()
	_, err = s.reg.Put(ctx, claim.Control{Key: attemptKey(a.RunID, a.Attempt), Value: v,
		Version: now.UnixNano(), First: true, Expires: now.Add(AttemptTTL)})
	return err
}

// attemptKey sorts a run's attempts in order (up to 999,999 of them).
func attemptKey(runID string, n int) string {
	return fmt.Sprintf("%s%s/%06d", attemptPrefix, runID, n)
}

// Attempts lists the recorded failed attempts of the runs whose id starts
// with prefix ("job@" for a job's, a run id for one run, "" for all), by
// run id, then attempt.
func (s *Store) Attempts(ctx context.Context, prefix string) ([]Attempt, error) {
	cs, err := s.reg.List(ctx, attemptPrefix+prefix)
	if err != nil {
		return nil, err
	}
	out := make([]Attempt, 0, len(cs))
	for _, c := range cs {
		var a Attempt
		if err := json.Unmarshal(c.Value, &a); err != nil {
			return nil, fmt.Errorf("control %s: %w", c.Key, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// AttemptsByRun groups attempts by run id.
func AttemptsByRun(as []Attempt) map[string][]Attempt {
	m := map[string][]Attempt{}
	for _, a := range as {
		m[a.RunID] = append(m[a.RunID], a)
	}
	return m
}
