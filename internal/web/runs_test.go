package web_test

import (
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/web"
)

func TestRunsJoinAttemptsRetriesAndJitter(t *testing.T) {
	daily := mustSchedule(t, "@daily")
	jobs := []web.JobInfo{
		{Name: "jittered", Parsed: daily, Jitter: time.Hour, MaxAttempts: 3},
		{Name: "plain", Parsed: daily, MaxAttempts: 5},
	}
	at := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
	t0 := at.Add(10 * time.Minute)
	rec := func(job string, at time.Time, st claim.Status, attempt int, leaseUntil time.Time) claim.Record {
		return claim.Record{RunID: claim.Run{Job: job, At: at}.ID(), Job: job, At: at, Status: st, Attempt: attempt,
			StartedAt: t0, LeaseUntil: leaseUntil}
	}
	failed := func(job string, at time.Time, attempt int, retryAt time.Time) control.Attempt {
		return control.Attempt{RunID: claim.Run{Job: job, At: at}.ID(), Attempt: attempt, Status: claim.Failed,
			Error: "boom", Started: t0, Ended: t0.Add(time.Second), RetryAt: retryAt}
	}
	manual := control.ManualInstant(at.Add(time.Hour))
	for _, tc := range []struct {
		name      string
		rec       claim.Record
		attempts  []control.Attempt
		wantRetry *web.Retry
		wantN     int // attempts of the run
		wantStart time.Time
		wantMax   int
	}{
		{name: "RetryPendingIsDueAtItsRecordedTime",
			rec:       rec("plain", at, claim.Running, 1, t0.Add(5*time.Second)),
			attempts:  []control.Attempt{failed("plain", at, 1, t0.Add(30*time.Second))},
			wantRetry: &web.Retry{Attempt: 2, At: t0.Add(30 * time.Second)}, wantN: 1, wantMax: 5},
		{name: "RetryWaitsForALeaseThatWasNotCut",
			rec:       rec("plain", at, claim.Running, 2, t0.Add(time.Minute)),
			attempts:  []control.Attempt{failed("plain", at, 1, t0), failed("plain", at, 2, t0.Add(30*time.Second))},
			wantRetry: &web.Retry{Attempt: 3, At: t0.Add(time.Minute)}, wantN: 2, wantMax: 5},
		{name: "RetryTakenOverIsNoLongerPending",
			rec:      rec("plain", at, claim.Running, 2, t0.Add(time.Minute)),
			attempts: []control.Attempt{failed("plain", at, 1, t0.Add(30*time.Second))},
			wantN:    1, wantMax: 5},
		{name: "EndedRunHasNoRetry",
			rec:      rec("plain", at, claim.Failed, 2, t0),
			attempts: []control.Attempt{failed("plain", at, 1, t0), failed("plain", at, 2, time.Time{})},
			wantN:    2, wantMax: 5},
		{name: "OtherRunsAttemptsAreIgnored",
			rec:      rec("plain", at, claim.Running, 1, t0.Add(time.Minute)),
			attempts: []control.Attempt{failed("plain", at.Add(24*time.Hour), 1, t0.Add(30*time.Second))},
			wantMax:  5},
		{name: "JitteredInstantStartsLater",
			rec:       rec("jittered", at, claim.Succeeded, 1, t0),
			wantStart: daily.Jittered("jittered", at, time.Hour), wantMax: 3},
		{name: "ManualRunStartsWhenAsked",
			rec:     rec("jittered", manual, claim.Succeeded, 1, t0),
			wantMax: 3},
		{name: "UnknownJobShowsNeither",
			rec: rec("gone", at, claim.Succeeded, 1, t0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := web.Runs([]claim.Record{tc.rec}, tc.attempts, jobs)
			if len(runs) != 1 {
				t.Fatalf("%d runs, want 1", len(runs))
			}
			r := runs[0]
			if r.Record != tc.rec || r.Attempts == nil || len(r.Attempts) != tc.wantN || r.MaxAttempts != tc.wantMax {
				t.Fatalf("run %+v, want the record, %d attempts, max %d", r, tc.wantN, tc.wantMax)
			}
			switch {
			case tc.wantRetry == nil && r.RetryPending != nil,
				tc.wantRetry != nil && (r.RetryPending == nil || r.RetryPending.Attempt != tc.wantRetry.Attempt || !r.RetryPending.At.Equal(tc.wantRetry.At)):
				t.Fatalf("retry pending %+v, want %+v", r.RetryPending, tc.wantRetry)
			}
			switch {
			case tc.wantStart.IsZero() && r.StartsAt != nil,
				!tc.wantStart.IsZero() && (r.StartsAt == nil || !r.StartsAt.Equal(tc.wantStart)):
				t.Fatalf("starts at %v, want %v", r.StartsAt, tc.wantStart)
			}
			if !tc.wantStart.IsZero() && !tc.wantStart.After(at) {
				t.Fatalf("the jittered start %v is not after the instant %v: a useless case", tc.wantStart, at)
			}
		})
	}
}

// GET /api/runs, GET /api/jobs and the page show a run's failed attempts,
// its retry pending and its start under jitter.
func TestRunsShowAttemptsRetriesAndJitter(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	ctx := t.Context()
	now := time.Now().UTC()
	day := now.Truncate(24 * time.Hour)
	daily := mustSchedule(t, "@daily")

	// Yesterday's run failed for good after one attempt; today's failed
	// its first attempt, left the record running, and retries later.
	ended := claim.Run{Job: "billing.nightly", At: day.Add(-24 * time.Hour)}
	pending := claim.Run{Job: "billing.nightly", At: day}
	retryAt := now.Add(2 * time.Minute) // past the lease: the retry is due then
	for _, x := range []struct {
		run     claim.Run
		err     string
		retryAt time.Time
	}{{ended, "connection refused\n\tat invoices.go:12", time.Time{}}, {pending, "boom", retryAt}} {
		cl, err := claim.ClaimOne(ctx, e.claimer, x.run, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		st := claim.Failed
		if !x.retryAt.IsZero() {
			st = claim.Timeout
		}
		if err := e.controls.RecordAttempt(ctx, control.Attempt{RunID: cl.ID(), Attempt: cl.Attempt, Fence: cl.Fence,
			Holder: "web-1", Status: st, Error: x.err, Started: now.Add(-5 * time.Second), Ended: now, RetryAt: x.retryAt}); err != nil {
			t.Fatal(err)
		}
		if x.retryAt.IsZero() {
			if err := claim.ReleaseOne(ctx, e.claimer, cl, claim.Failed); err != nil {
				t.Fatal(err)
			}
		}
	}
	plain := claim.Run{Job: "minutely", At: now.Truncate(time.Minute)}
	cl, err := claim.ClaimOne(ctx, e.claimer, plain, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := claim.ReleaseOne(ctx, e.claimer, cl, claim.Succeeded); err != nil {
		t.Fatal(err)
	}

	type runJSON struct {
		RunID        string            `json:"run_id"`
		Status       claim.Status      `json:"status"`
		Attempt      int               `json:"attempt"`
		MaxAttempts  int               `json:"max_attempts"`
		StartsAt     *time.Time        `json:"starts_at"`
		Attempts     []control.Attempt `json:"attempts"`
		RetryPending *web.Retry        `json:"retry_pending"`
	}
	var runs []runJSON
	e.call("GET", "/api/runs?job=billing.nightly", "", 200, &runs)
	if len(runs) != 2 || runs[0].RunID != pending.ID() || runs[1].RunID != ended.ID() {
		t.Fatalf("runs of billing.nightly: %+v", runs)
	}
	p, f := runs[0], runs[1]
	if p.Status != claim.Running || p.Attempt != 1 || p.MaxAttempts != 3 ||
		p.RetryPending == nil || p.RetryPending.Attempt != 2 || !p.RetryPending.At.Equal(retryAt) ||
		len(p.Attempts) != 1 || p.Attempts[0].Error != "boom" || p.Attempts[0].Status != claim.Timeout ||
		!p.Attempts[0].RetryAt.Equal(retryAt) {
		t.Fatalf("the run retrying: %+v", p)
	}
	wantStart := daily.Jittered("billing.nightly", day, nightlyJitter)
	if p.StartsAt == nil || !p.StartsAt.Equal(wantStart) || !wantStart.After(day) {
		t.Fatalf("the run retrying starts at %v, want %v (jittered)", p.StartsAt, wantStart)
	}
	if f.Status != claim.Failed || f.RetryPending != nil || len(f.Attempts) != 1 || !f.Attempts[0].RetryAt.IsZero() ||
		f.StartsAt == nil || !f.StartsAt.Equal(daily.Jittered("billing.nightly", ended.At, nightlyJitter)) {
		t.Fatalf("the run that ended failed: %+v", f)
	}
	// A job without jitter, and a run without failed attempts, say so.
	_, _, text := e.do("GET", "/api/runs?job=minutely", "", "")
	for _, want := range []string{`"attempts":[]`, `"starts_at":null`, `"retry_pending":null`} {
		if !strings.Contains(text, want) {
			t.Fatalf("runs of minutely: %s; want %s", text, want)
		}
	}
	if strings.Contains(text, `"max_attempts"`) {
		t.Fatalf("runs of minutely: %s; want no max_attempts (its JobInfo has none)", text)
	}
	e.call("GET", "/api/runs", "", 200, &runs)
	if len(runs) != 3 {
		t.Fatalf("every run: %+v", runs)
	}

	var jobs []struct {
		Name       string     `json:"name"`
		Next       *time.Time `json:"next"`
		NextStarts *time.Time `json:"next_starts_at"`
	}
	e.call("GET", "/api/jobs", "", 200, &jobs)
	if len(jobs) != 2 || jobs[0].Next == nil || jobs[0].NextStarts == nil ||
		!jobs[0].NextStarts.Equal(daily.Jittered("billing.nightly", *jobs[0].Next, nightlyJitter)) || jobs[1].NextStarts != nil {
		t.Fatalf("jobs: %+v", jobs)
	}

	code, _, page := e.do("GET", "/", "", "")
	_, runsTable, _ := strings.Cut(page, `<table id="runs">`)
	_, claimsTable, _ := strings.Cut(page, `<table id="claims">`)
	claimsTable, _, _ = strings.Cut(claimsTable, "</table>")
	for _, c := range []struct{ where, text, want string }{
		{"runs", runsTable, `1/3 · <span class="retry">retry 2/3 at `},
		{"runs", runsTable, retryAt.Format("15:04:05Z") + "</span><details"}, // with its date past midnight
		{"runs", runsTable, `1 failed</summary>`},
		{"runs", runsTable, `<span class="timeout">timeout</span> on web-1`},
		{"runs", runsTable, `<code>boom</code>; retry due `},
		{"runs", runsTable, "<code>connection refused\n\tat invoices.go:12</code></li>"},
		{"runs", runsTable, `<span class="starts">· starts ` + wantStart.Format("15:04:05Z") + ` (jitter)</span>`},
		{"claims", claimsTable, `<td>1/3</td><td><span class="retry">retry 2/3 in `},
		{"jobs", page, `<span class="starts">· starts `},
	} {
		if code != 200 || !strings.Contains(c.text, c.want) {
			t.Fatalf("the page's %s lack %q:\n%s", c.where, c.want, page)
		}
	}
}
