package jobs_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/jobs"
	"github.com/scheduler-dev/scheduler/job"
)

func TestSleepFailsTheAttemptsItIsAskedTo(t *testing.T) {
	h := job.Typed(jobs.Sleep)
	cases := []struct {
		name    string
		params  job.Params
		attempt int
		fail    bool
	}{
		{"NoParams", nil, 1, false},
		{"FirstOfTwo", job.Params{"fail_attempts": 2}, 1, true},
		{"SecondOfTwo", job.Params{"fail_attempts": 2, "duration": "1ms"}, 2, true},
		{"ThirdAfterTwo", job.Params{"fail_attempts": 2}, 3, false},
		{"Zero", job.Params{"fail_attempts": 0}, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := h(t.Context(), job.Run{Job: jobs.SleepName, Attempt: tc.attempt, Params: tc.params,
				Logger: slog.New(slog.DiscardHandler)})
			if got := errors.Is(err, jobs.ErrSleepFailed); got != tc.fail || !got && err != nil {
				t.Fatalf("attempt %d with %v: %v, want failed %v", tc.attempt, tc.params, err, tc.fail)
			}
		})
	}
}

func TestSleepReturnsTheCauseWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(job.ErrLeaseLost)
	err := job.Typed(jobs.Sleep)(ctx, job.Run{Job: jobs.SleepName, Attempt: 1,
		Params: job.Params{"duration": "1h", "fail_attempts": 1}, Logger: slog.New(slog.DiscardHandler)})
	if !errors.Is(err, job.ErrLeaseLost) || errors.Is(err, jobs.ErrSleepFailed) {
		t.Fatalf("cancelled attempt returned %v, want the cause", err)
	}
}

func TestSleepParamsAreCheckedStrictly(t *testing.T) {
	reg := job.NewRegistry()
	job.MustRegisterTyped(reg, jobs.SleepName, jobs.Sleep)
	cases := []struct {
		name   string
		params job.Params
		want   []string // what the error names; none for no error
	}{
		{"Valid", job.Params{"duration": "1s", "fail_attempts": 2}, nil},
		{"Negative", job.Params{"fail_attempts": -1}, []string{`jobs.example.sleep.params.fail_attempts: "-1": must not be negative`}},
		{"NotANumber", job.Params{"fail_attempts": "two"}, []string{"jobs.example.sleep.params.fail_attempts"}},
		{"Misspelt", job.Params{"fail_attempt": 2}, []string{"jobs.example.sleep.params.fail_attempt"}},
		{"BothNegative", job.Params{"duration": "-1s", "fail_attempts": -1}, []string{"params.duration", "params.fail_attempts"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := reg.CheckParams(jobs.SleepName, tc.params)
			if (err != nil) != (len(tc.want) > 0) {
				t.Fatalf("%v: %v, want an error naming %q", tc.params, err, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("%v: %v, want an error naming %q", tc.params, err, w)
				}
			}
		})
	}
}
