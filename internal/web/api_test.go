package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/web"
	"github.com/scheduler-dev/scheduler/job"
)

const secretToken = "tok-S3cr3t-9f8e7d"

// nightlyJitter is billing.nightly's jitter in newAPIEnv; minutely has none.
const nightlyJitter = time.Hour

// apiEnv is a web server over a memory store, with a runner for
// backfills of the job "minutely".
type apiEnv struct {
	t        *testing.T
	srv      *httptest.Server
	web      *web.Server
	store    *memory.Store
	claimer  *memory.Claimer
	controls *control.Store
	logs     *testenv.Logs
	ran      atomic.Int64
	release  chan struct{} // when set, backfilled runs wait for it or ctx
	running  chan struct{} // closed once a backfilled run started
	once     sync.Once
	seen     testenv.Logs // every response, headers included
}

func mustSchedule(t *testing.T, spec string) *schedule.Schedule {
	t.Helper()
	s, err := schedule.Parse(spec, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newAPIEnv(t *testing.T, token string, wrap func(http.Handler) http.Handler) *apiEnv {
	t.Helper()
	e := &apiEnv{t: t, store: memory.NewStore(nil), logs: &testenv.Logs{}, running: make(chan struct{})}
	e.claimer = memory.New(e.store, "web-1")
	e.controls = control.New(e.store.Controls(), nil)
	minutely := mustSchedule(t, "0 * * * * *")
	jobs := []runner.Job{{Name: "minutely", Schedule: minutely, Handler: func(ctx context.Context, run job.Run) error {
		e.ran.Add(1)
		e.once.Do(func() { close(e.running) })
		if e.release != nil {
			select {
			case <-e.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}}}
	// As if the claimer forgot finished runs after 20 minutes (a Redis
	// done_ttl).
	r, err := runner.New(runner.Options{Claimer: e.claimer, Instance: "web-1", Lease: 3 * time.Second,
		Logger: slog.New(slog.DiscardHandler), Forgets: 20 * time.Minute, ForgetsKey: "claimer.redis.done_ttl"}, jobs)
	if err != nil {
		t.Fatal(err)
	}
	e.web = web.New(web.Options{
		Instance: "web-1", Claimer: "memory", History: e.claimer, Controls: e.controls, Token: token,
		Backfill: r.Backfill, CheckBackfill: r.CheckBackfill, Logger: slog.New(slog.NewJSONHandler(e.logs, nil)),
		Jobs: []web.JobInfo{
			{Name: "billing.nightly", Schedule: "@daily", Timezone: "UTC",
				Next:   func(t time.Time) time.Time { return t.Truncate(24 * time.Hour).Add(24 * time.Hour) },
				Parsed: mustSchedule(t, "@daily"), Jitter: nightlyJitter, MaxAttempts: 3},
			{Name: "minutely", Schedule: "0 * * * * *", Timezone: "UTC", Next: minutely.Next},
		},
	})
	var h http.Handler = e.web
	if wrap != nil {
		h = wrap(h)
	}
	e.srv = httptest.NewServer(h)
	t.Cleanup(func() {
		e.srv.Client().CloseIdleConnections()
		e.srv.Close()
		_ = e.web.Close()
		if token != "" {
			for what, text := range map[string]string{"logs": e.logs.String(), "responses": e.seen.String()} {
				if strings.Contains(text, token) {
					t.Errorf("the token appears in the %s:\n%s", what, text)
				}
			}
		}
	})
	return e
}

// do sends a request and returns its status, headers and body.
func (e *apiEnv) do(method, path, auth, body string, hdr ...string) (int, http.Header, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	_ = resp.Header.Write(&e.seen)
	_, _ = e.seen.Write(b)
	return resp.StatusCode, resp.Header, string(b)
}

// call is do with the right token, decoding a JSON answer into v.
func (e *apiEnv) call(method, path, body string, wantCode int, v any, hdr ...string) http.Header {
	e.t.Helper()
	code, h, text := e.do(method, path, "Bearer "+secretToken, body, hdr...)
	if code != wantCode {
		e.t.Fatalf("%s %s %s = %d %s, want %d", method, path, body, code, text, wantCode)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		e.t.Fatalf("%s %s: Content-Type %q", method, path, ct)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(text), v); err != nil {
			e.t.Fatalf("%s %s: %v in %s", method, path, err, text)
		}
	}
	return h
}

func TestAPIAuth(t *testing.T) {
	past := time.Now().Add(-10 * time.Minute).UTC().Format(time.RFC3339)
	now := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	calls := []struct{ path, body string }{
		{"/api/jobs/billing.nightly/pause", ""},
		{"/api/jobs/billing.nightly/resume", `{"note":"n"}`},
		{"/api/jobs/*/pause", ""},
		{"/api/jobs/billing.nightly/trigger", `{}`},
		{"/api/jobs/minutely/backfill", `{"from":"` + past + `","to":"` + now + `","dry_run":true}`},
	}
	off := newAPIEnv(t, "", nil)
	on := newAPIEnv(t, secretToken, nil)
	cases := []struct {
		name     string
		env      *apiEnv
		auth     string
		wantCode int
	}{
		{"no token configured", off, "Bearer " + secretToken, http.StatusForbidden},
		{"no token configured, none sent", off, "", http.StatusForbidden},
		{"missing", on, "", http.StatusUnauthorized},
		{"wrong", on, "Bearer " + secretToken + "x", http.StatusUnauthorized},
		{"prefix", on, "Bearer " + secretToken[:5], http.StatusUnauthorized},
		{"empty bearer", on, "Bearer ", http.StatusUnauthorized},
		{"basic scheme", on, "Basic " + secretToken, http.StatusUnauthorized},
		{"right", on, "Bearer " + secretToken, 0},
		{"right, lower-case scheme", on, "bearer " + secretToken, 0},
	}
	for _, tc := range cases {
		for _, c := range calls {
			t.Run(tc.name+" "+c.path, func(t *testing.T) {
				code, h, body := tc.env.do("POST", c.path, tc.auth, c.body)
				switch tc.wantCode {
				case 0:
					if code < 200 || code > 299 {
						t.Fatalf("= %d %s, want 2xx", code, body)
					}
				case http.StatusForbidden:
					want := `{"error":"the API's mutating calls are off: set http.token or http.token_file"}` + "\n"
					if code != tc.wantCode || body != want {
						t.Fatalf("= %d %s, want %d %s", code, body, tc.wantCode, want)
					}
				case http.StatusUnauthorized:
					if code != tc.wantCode || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") || !strings.Contains(body, `"error"`) {
						t.Fatalf("= %d %v %s, want 401 with WWW-Authenticate: Bearer", code, h, body)
					}
				}
				if ct := h.Get("Content-Type"); ct != "application/json" {
					t.Fatalf("Content-Type %q", ct)
				}
			})
		}
	}
	// Nothing refused reached the store.
	if ps, _ := off.controls.Pauses(t.Context()); len(ps) != 0 {
		t.Fatalf("a refused call paused: %v", ps)
	}
	// Reads need no token, on either server.
	for _, e := range []*apiEnv{off, on} {
		for _, path := range []string{"/api/jobs", "/api/runs", "/api/runs?job=minutely&limit=3", "/"} {
			if code, _, body := e.do("GET", path, "", ""); code != 200 {
				t.Fatalf("GET %s without a token = %d %s", path, code, body)
			}
		}
		if code, _, body := e.do("GET", "/api/backfills/nope", "", ""); code != 404 || !strings.Contains(body, `"error"`) {
			t.Fatalf("GET /api/backfills/nope = %d %s", code, body)
		}
	}
	if strings.Contains(on.logs.String(), `"msg":"operator action"`) == false {
		t.Fatalf("no operator action logged:\n%s", on.logs.String())
	}
}

func TestPauseResumeReachTheControlStore(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	ctx := t.Context()
	var p control.Pause
	e.call("POST", "/api/jobs/billing.nightly/pause", `{"note":"quarter close","by":"alice"}`, 200, &p, "X-Request-Id", "req-1")
	if !p.Paused || p.Job != "billing.nightly" || p.Note != "quarter close" || p.By != "alice" || p.RequestID != "req-1" {
		t.Fatalf("pause answered %+v", p)
	}
	ps, err := e.controls.Pauses(ctx)
	if err != nil || !ps.Paused("billing.nightly") || ps.Paused("minutely") || ps["billing.nightly"].By != "alice" {
		t.Fatalf("store after pause: %+v %v", ps, err)
	}
	// The default identity is the caller's address; no body is fine.
	e.call("POST", "/api/jobs/billing.nightly/resume", "", 200, &p)
	if p.Paused || p.By != "api@127.0.0.1" || p.RequestID == "" {
		t.Fatalf("resume answered %+v", p)
	}
	if ps, _ = e.controls.Pauses(ctx); ps.Paused("billing.nightly") {
		t.Fatalf("still paused after resume: %+v", ps)
	}
	// "*" pauses every job, and GET /api/jobs shows the governing switch.
	e.call("POST", "/api/jobs/*/pause", `{"note":"freeze"}`, 200, &p)
	if ps, _ = e.controls.Pauses(ctx); !ps.Paused("minutely") || !ps.Paused("billing.nightly") || ps[control.AllJobs].Note != "freeze" {
		t.Fatalf("store after pausing every job: %+v", ps)
	}
	var jobs []map[string]any
	e.call("GET", "/api/jobs", "", 200, &jobs)
	if len(jobs) != 2 {
		t.Fatalf("GET /api/jobs = %v", jobs)
	}
	for _, j := range jobs {
		pz, _ := j["paused"].(map[string]any)
		if pz == nil || pz["paused"] != true || pz["job"] != "*" || pz["note"] != "freeze" {
			t.Fatalf("job %v: paused %v", j["name"], j["paused"])
		}
	}
	// An action is logged once, with who and why but never the token.
	var n int
	for line := range strings.SplitSeq(strings.TrimSpace(e.logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec["msg"] != "operator action" || rec["request_id"] != "req-1" {
			continue
		}
		n++
		if rec["level"] != "INFO" || rec["action"] != "pause" || rec["job"] != "billing.nightly" || rec["by"] != "alice" || rec["note"] != "quarter close" {
			t.Fatalf("logged %v", rec)
		}
	}
	if n != 1 {
		t.Fatalf("the pause was logged %d times:\n%s", n, e.logs.String())
	}
}

type triggerAnswer struct {
	Request control.Request `json:"request"`
	Created bool            `json:"created"`
	RunID   string          `json:"run_id"`
}

func TestTriggerIsIdempotent(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	var first, again, other triggerAnswer
	e.call("POST", "/api/jobs/billing.nightly/trigger", `{"note":"rerun report","by":"bob"}`, 202, &first, "Idempotency-Key", "k-1")
	if !first.Created || first.Request.ID != "k-1" || first.Request.By != "bob" || first.RunID != first.Request.Run().ID() ||
		!strings.HasPrefix(first.RunID, "billing.nightly@") {
		t.Fatalf("first trigger: %+v", first)
	}
	e.call("POST", "/api/jobs/billing.nightly/trigger", `{"request_id":"k-1","by":"bob"}`, 200, &again)
	if again.Created || again.RunID != first.RunID {
		t.Fatalf("second trigger: %+v, first %+v", again, first)
	}
	e.call("POST", "/api/jobs/billing.nightly/trigger", `{"overlap":"allow"}`, 202, &other)
	if !other.Created || other.Request.ID == first.Request.ID || other.Request.Overlap != "allow" {
		t.Fatalf("trigger without an id: %+v", other)
	}
	reqs, err := e.controls.Requests(t.Context())
	if err != nil || len(reqs) != 2 || reqs[0].ID != "k-1" || reqs[0].Note != "rerun report" {
		t.Fatalf("requests in the store: %+v %v", reqs, err)
	}
	// The same id for another job is a conflict, not a second run.
	if code, _, body := e.do("POST", "/api/jobs/minutely/trigger", "Bearer "+secretToken, `{"request_id":"k-1"}`); code != 409 {
		t.Fatalf("reused id for another job = %d %s", code, body)
	}
}

func TestAPIRejectsBadInput(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"POST", "/api/jobs/nope/pause", "", 404, `unknown job \"nope\"`},
		{"POST", "/api/jobs/nope/trigger", "", 404, "unknown job"},
		{"POST", "/api/jobs/*/trigger", "", 404, "unknown job"},
		{"POST", "/api/jobs/nope/backfill", "", 404, "unknown job"},
		{"GET", "/api/runs?job=nope", "", 404, "unknown job"},
		{"GET", "/api/runs?limit=x", "", 400, "limit"},
		{"GET", "/api/runs?limit=0", "", 400, "limit"},
		{"POST", "/api/jobs/minutely/pause", `{"note":`, 400, "invalid JSON"},
		{"POST", "/api/jobs/minutely/pause", `{"paused":true}`, 400, `paused\": unknown field`},
		{"POST", "/api/jobs/minutely/pause", `{"note":5}`, 400, "note: want a JSON string"},
		{"POST", "/api/jobs/minutely/pause", `[]`, 400, "body"},
		{"POST", "/api/jobs/minutely/pause", `{"by":"a\u0000b"}`, 400, "by: contains a control character"},
		{"POST", "/api/jobs/minutely/pause", `{"by":"\u202eevil\u200b"}`, 400, "by: contains an invisible format character (U+202E)"},
		{"POST", "/api/jobs/minutely/pause", `{"request_id":"` + strings.Repeat("x", 300) + `"}`, 400, "request_id"},
		{"POST", "/api/jobs/minutely/pause", `{"request_id":" x "}`, 400, "request_id \\\" x \\\" has leading or trailing whitespace"},
		{"POST", "/api/jobs/minutely/trigger", `{"overlap":"sometimes"}`, 400, "overlap"},
		{"POST", "/api/jobs/minutely/backfill", `{"from":"0001-01-01T00:00:00Z","to":"` + past + `"}`, 400, "neither may be the zero time"},
		{"POST", "/api/jobs/minutely/backfill", `{}`, 400, "from: required"},
		{"POST", "/api/jobs/minutely/backfill", `{"from":"` + past + `"}`, 400, "to: required"},
		{"POST", "/api/jobs/minutely/backfill", `{"from":"yesterday","to":"` + past + `"}`, 400, "from: \\\"yesterday\\\" is not an RFC 3339 time"},
		{"POST", "/api/jobs/minutely/backfill", `{"from":"` + past + `","to":"` + future + `"}`, 400, "to: " + future + " is in the future"},
		{"POST", "/api/jobs/minutely/backfill", `{"from":"` + future + `","to":"` + past + `"}`, 400, "is before from"},
		{"POST", "/api/jobs/minutely/backfill", `{"from":"` + past + `","to":"` + past + `","rerun":"some"}`, 400, "rerun"},
		{"POST", "/api/jobs/minutely/backfill", `{"from":"` + past + `","to":"` + past + `","max_concurrent":"4"}`, 400, "max_concurrent"},
		{"POST", "/api/jobs/minutely/backfill", `{"from":"` + past + `","to":"` + past + `","max_concurrent":-1}`, 400, "max_concurrent"},
		{"POST", "/api/jobs/billing.nightly/backfill", `{"from":"` + past + `","to":"` + past + `","dry_run":true}`, 400, "unknown job"},
	} {
		code, h, body := e.do(c.method, c.path, "Bearer "+secretToken, c.body)
		if code != c.code || !strings.Contains(body, c.want) || h.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s %s = %d %s, want %d naming %s", c.method, c.path, c.body, code, body, c.code, c.want)
		}
	}
	if ps, _ := e.controls.Pauses(t.Context()); len(ps) != 0 {
		t.Fatalf("a refused call paused: %v", ps)
	}
}

func TestJobsAndRuns(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	ctx := t.Context()
	day := time.Now().UTC().Truncate(24 * time.Hour)
	for i, st := range []claim.Status{claim.Succeeded, claim.Missed, claim.Failed, claim.Missed} {
		run := claim.Run{Job: "billing.nightly", At: day.Add(-time.Duration(4-i) * 24 * time.Hour)}
		cl, err := claim.ClaimOne(ctx, e.claimer, run, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.ReleaseOne(ctx, e.claimer, cl, st); err != nil {
			t.Fatal(err)
		}
	}
	recs, _ := e.claimer.History(ctx, "billing.nightly", 10)
	var success time.Time
	for _, r := range recs {
		if r.Status == claim.Succeeded {
			success = r.FinishedAt
		}
	}
	var jobs []struct {
		Name        string         `json:"name"`
		Schedule    string         `json:"schedule"`
		Timezone    string         `json:"timezone"`
		Next        *time.Time     `json:"next"`
		Paused      *control.Pause `json:"paused"`
		LastStatus  *string        `json:"last_status"`
		LastSuccess *time.Time     `json:"last_success"`
		Missed      int            `json:"missed"`
	}
	e.call("GET", "/api/jobs", "", 200, &jobs)
	if len(jobs) != 2 {
		t.Fatalf("jobs: %+v", jobs)
	}
	b, m := jobs[0], jobs[1]
	if b.Name != "billing.nightly" || b.Schedule != "@daily" || b.Next == nil || !b.Next.Equal(day.Add(24*time.Hour)) ||
		b.Paused != nil || b.LastStatus == nil || *b.LastStatus != "missed" || b.LastSuccess == nil ||
		!b.LastSuccess.Equal(success) || b.Missed != 2 {
		t.Fatalf("billing.nightly: %+v", b)
	}
	if m.Name != "minutely" || m.LastStatus != nil || m.LastSuccess != nil || m.Missed != 0 || m.Next == nil {
		t.Fatalf("minutely: %+v", m)
	}
	var runs []claim.Record
	e.call("GET", "/api/runs?job=billing.nightly&limit=3", "", 200, &runs)
	if len(runs) != 3 || runs[0].Status != claim.Missed || runs[0].Job != "billing.nightly" {
		t.Fatalf("runs: %+v", runs)
	}
	e.call("GET", "/api/runs?job=minutely", "", 200, &runs)
	if runs == nil || len(runs) != 0 {
		t.Fatalf("runs of minutely: %#v", runs)
	}
	e.call("GET", "/api/runs?limit=100000", "", 200, &runs)
	if len(runs) != 4 {
		t.Fatalf("every run: %+v", runs)
	}
	// The page shows the same.
	code, _, page := e.do("GET", "/", "", "")
	for _, want := range []string{`class="missed">2</td>`, `<td class="missed">missed</td>`, `aria-label="pause billing.nightly"`,
		`aria-label="run minutely now"`, `id="action-result"`, `type="password" id="token"`} {
		if code != 200 || !strings.Contains(page, want) {
			t.Fatalf("status page lacks %s:\n%s", want, page)
		}
	}
	if strings.Contains(page, "http-equiv=\"refresh\" content=\"5\">\n<title") {
		t.Fatal("meta refresh outside noscript")
	}
}

type backfillStatus struct {
	ID        string                 `json:"id"`
	Job       string                 `json:"job"`
	Replica   string                 `json:"replica"`
	UpdatedAt time.Time              `json:"updated_at"`
	Done      bool                   `json:"done"`
	Summary   runner.BackfillSummary `json:"summary"`
	Error     *string                `json:"error"`
}

// waitBackfill polls GET /api/backfills/{id} until it is done.
func (e *apiEnv) waitBackfill(id string) backfillStatus {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var st backfillStatus
		e.call("GET", "/api/backfills/"+id, "", 200, &st)
		if st.Done {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("backfill %s not done by the deadline: %+v", id, st)
		}
		select {
		case <-tick.C:
		case <-e.t.Context().Done():
			e.t.Fatal(e.t.Context().Err())
		}
	}
}

func TestBackfillThroughTheAPI(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	to := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
	from := to.Add(-9 * time.Minute)
	rng := fmt.Sprintf(`"from":%q,"to":%q`, from.Format(time.RFC3339), to.Format(time.RFC3339))

	var plan struct {
		Items   []runner.BackfillItem  `json:"items"`
		Summary runner.BackfillSummary `json:"summary"`
	}
	e.call("POST", "/api/jobs/minutely/backfill", `{`+rng+`,"dry_run":true}`, 200, &plan)
	if len(plan.Items) != 10 || plan.Summary.Instants != 10 || plan.Summary.Planned != 10 || e.ran.Load() != 0 ||
		!plan.Items[0].At.Equal(from) || plan.Items[0].Action != runner.ActionRun {
		t.Fatalf("dry run: %+v, ran %d", plan, e.ran.Load())
	}

	var started struct {
		ID  string `json:"id"`
		URL string `json:"url"`
	}
	e.call("POST", "/api/jobs/minutely/backfill", `{`+rng+`,"max_concurrent":3,"newest_first":true,"by":"carol"}`, 202, &started)
	if started.ID == "" || started.URL != "/api/backfills/"+started.ID {
		t.Fatalf("started: %+v", started)
	}
	st := e.waitBackfill(started.ID)
	if st.Error != nil || st.Job != "minutely" || st.Summary.Succeeded != 10 || st.Summary.Settled != 10 || e.ran.Load() != 10 {
		t.Fatalf("backfill: %+v, ran %d", st, e.ran.Load())
	}
	recs, _ := e.claimer.History(t.Context(), "minutely", 100)
	if len(recs) != 10 {
		t.Fatalf("%d records after the backfill", len(recs))
	}
	// Again: everything already ran, so it is kept.
	e.call("POST", "/api/jobs/minutely/backfill", `{`+rng+`,"dry_run":true}`, 200, &plan)
	if plan.Summary.Kept != 10 || plan.Summary.Planned != 0 {
		t.Fatalf("second dry run: %+v", plan.Summary)
	}
	e.call("POST", "/api/jobs/minutely/backfill", `{`+rng+`}`, 202, &started)
	if st := e.waitBackfill(started.ID); st.Error != nil || st.Summary.Kept != 10 || e.ran.Load() != 10 {
		t.Fatalf("second backfill: %+v, ran %d", st, e.ran.Load())
	}
}

// A backfill reaching back past what the claimer remembers of finished
// runs is refused (400, naming the setting), dry run or not, before
// anything runs: those runs would look never run and run again. The CLI
// refused it; the API answered 202 and re-ran six finished runs (an
// outside review).
func TestTheAPIRefusesABackfillPastWhatTheClaimerRemembers(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	to := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
	from := to.Add(-30 * time.Minute)
	rng := fmt.Sprintf(`"from":%q,"to":%q`, from.Format(time.RFC3339), to.Format(time.RFC3339))
	for _, body := range []string{`{` + rng + `,"dry_run":true}`, `{` + rng + `}`} {
		code, _, answer := e.do("POST", "/api/jobs/minutely/backfill", "Bearer "+secretToken, body)
		if code != http.StatusBadRequest || !strings.Contains(answer, "claimer.redis.done_ttl") {
			t.Errorf("backfill %s: %d %s; want 400 naming claimer.redis.done_ttl", body, code, answer)
		}
	}
	if n := e.ran.Load(); n != 0 {
		t.Fatalf("%d runs executed by a refused backfill", n)
	}
}

// A backfill call sent again with its request id (a client retrying
// after a timeout) finds the backfill it started instead of starting the
// range again: under rerun all, every instant ran twice (an outside
// review). The id for another job is a conflict; a blank one is refused.
func TestABackfillRetriedWithItsRequestIDStartsOnce(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	to := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
	from := to.Add(-4 * time.Minute)
	body := fmt.Sprintf(`{"from":%q,"to":%q,"rerun":"all","request_id":"bf-once-1"}`, from.Format(time.RFC3339), to.Format(time.RFC3339))
	var first, again struct {
		ID, URL, Replica string
	}
	e.call("POST", "/api/jobs/minutely/backfill", body, 202, &first)
	e.call("POST", "/api/jobs/minutely/backfill", body, 200, &again)
	if again.ID != first.ID || again.URL != first.URL || again.Replica != "web-1" {
		t.Fatalf("the retry answered %+v, want the first backfill %+v on web-1", again, first)
	}
	// By header too.
	e.call("POST", "/api/jobs/minutely/backfill", strings.Replace(body, `,"request_id":"bf-once-1"`, "", 1), 200, &again,
		"X-Request-Id", "bf-once-1")
	if st := e.waitBackfill(first.ID); st.Error != nil || st.Summary.Succeeded != 5 || e.ran.Load() != 5 {
		t.Fatalf("backfill: %+v, ran %d; want 5 instants run once", st, e.ran.Load())
	}
	if _, _, err := e.controls.StartBackfill(t.Context(), control.Backfill{RequestID: "bf-other", ID: "x", Replica: "web-2",
		Job: "billing.nightly"}); err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(body, `"bf-once-1"`, `"bf-other"`, 1)
	if code, _, answer := e.do("POST", "/api/jobs/minutely/backfill", "Bearer "+secretToken, other); code != http.StatusConflict {
		t.Errorf("an id another job's backfill took: %d %s, want 409", code, answer)
	}
	blank := strings.Replace(body, `"bf-once-1"`, `"   "`, 1)
	if code, _, answer := e.do("POST", "/api/jobs/minutely/backfill", "Bearer "+secretToken, blank); code != http.StatusBadRequest {
		t.Errorf("a blank request id: %d %s, want 400", code, answer)
	}
	if n := e.ran.Load(); n != 5 {
		t.Fatalf("%d runs in all, want 5", n)
	}
}

// Every replica answers for a backfill, not only the one running it: its
// state goes to the control store as it moves. Behind a load balancer the
// GET after a POST seldom reaches the same replica; it answered 404 (an
// outside review).
func TestEveryReplicaAnswersForABackfill(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	e.release = make(chan struct{})
	other := httptest.NewServer(web.Handler(web.Options{Instance: "web-2", Claimer: "memory", History: e.claimer, Controls: e.controls}))
	defer other.Close()
	defer other.Client().CloseIdleConnections()
	get := func(id string) (int, backfillStatus, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", other.URL+"/api/backfills/"+id, nil)
		resp, err := other.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var st backfillStatus
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(b, &st); err != nil {
				t.Fatalf("GET %s on web-2: %v in %s", id, err, b)
			}
		}
		return resp.StatusCode, st, string(b)
	}
	to := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
	body := fmt.Sprintf(`{"from":%q,"to":%q}`, to.Add(-2*time.Minute).Format(time.RFC3339), to.Format(time.RFC3339))
	var started struct{ ID, Replica string }
	e.call("POST", "/api/jobs/minutely/backfill", body, 202, &started)
	code, first, text := get(started.ID)
	if code != 200 || first.Done || first.Replica != "web-1" || first.UpdatedAt.IsZero() || first.Job != "minutely" {
		t.Fatalf("web-2 on a backfill running on web-1: %d %s; want its state, not done, on web-1", code, text)
	}
	// Its handler blocks, so its summary stands still; updated_at moves
	// on all the same, or a long item would read as a lost replica.
	for deadline := time.Now().Add(15 * time.Second); ; {
		code, st, text := get(started.ID)
		if code == 200 && !st.Done && st.UpdatedAt.After(first.UpdatedAt) {
			break
		}
		if code != 200 || st.Done || time.Now().After(deadline) {
			t.Fatalf("web-2 while web-1's backfill waits on a handler: %d %s; want updated_at past %s", code, text, first.UpdatedAt)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(e.release)
	if st := e.waitBackfill(started.ID); st.Summary.Succeeded != 3 {
		t.Fatalf("backfill on web-1: %+v", st)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, st, text := get(started.ID)
		if code == 200 && st.Done {
			if st.Error != nil || st.Summary.Succeeded != 3 || st.Summary.Settled != 3 {
				t.Fatalf("web-2 on the finished backfill: %s", text)
			}
			break
		}
		if code != 200 || time.Now().After(deadline) {
			t.Fatalf("web-2 on the backfill: %d %s; want it done, as web-1 says", code, text)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _, text := get("no-such-backfill"); code != http.StatusNotFound || !strings.Contains(text, "not on this replica") {
		t.Fatalf("web-2 on an unknown backfill: %d %s, want 404", code, text)
	}
}

// A call with the wrong method, or to no call at all, is answered in JSON
// as every other answer is, with the methods allowed; the mux's own are
// plain text, which a client parsing JSON reads as a broken server.
func TestWrongMethodsAndUnknownCallsAnswerJSON(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	for _, tc := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{"DELETE", "/api/jobs", 405, "GET, HEAD"},
		{"GET", "/api/jobs/minutely/pause", 405, "POST"},
		{"PUT", "/api/backfills/x", 405, "GET, HEAD"},
		{"GET", "/api/nothing", 404, ""},
		{"POST", "/api/jobs/minutely/explode", 404, ""},
	} {
		code, h, text := e.do(tc.method, tc.path, "Bearer "+secretToken, "")
		var answer struct{ Error string }
		if code != tc.code || h.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(text), &answer) != nil ||
			answer.Error == "" || h.Get("Allow") != tc.allow {
			t.Errorf("%s %s = %d %q, Allow %q: %s; want %d in JSON, Allow %q", tc.method, tc.path, code,
				h.Get("Content-Type"), h.Get("Allow"), text, tc.code, tc.allow)
		}
	}
	// The calls themselves still answer.
	e.call("GET", "/api/jobs", "", 200, nil)
	e.call("POST", "/api/jobs/minutely/pause", "", 200, nil)
}

// Closing the server stops the backfills it started, and refuses more.
func TestCloseStopsBackfills(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	e.release = make(chan struct{}) // never closed: runs wait for their ctx
	to := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
	body := fmt.Sprintf(`{"from":%q,"to":%q}`, to.Add(-2*time.Minute).Format(time.RFC3339), to.Format(time.RFC3339))
	var started struct{ ID string }
	e.call("POST", "/api/jobs/minutely/backfill", body, 202, &started)
	select {
	case <-e.running:
	case <-time.After(10 * time.Second):
		t.Fatal("the backfill never started a run")
	}
	if err := e.web.Close(); err != nil {
		t.Fatal(err)
	}
	var st backfillStatus
	e.call("GET", "/api/backfills/"+started.ID, "", 200, &st)
	if !st.Done || st.Error == nil || !strings.Contains(*st.Error, "canceled") {
		t.Fatalf("after Close: %+v", st)
	}
	if code, _, text := e.do("POST", "/api/jobs/minutely/backfill", "Bearer "+secretToken, body); code != 503 {
		t.Fatalf("backfill after Close = %d %s", code, text)
	}
}

// Without controls or a backfill function the calls say so.
func TestAPIWithoutControls(t *testing.T) {
	srv := httptest.NewServer(web.Handler(web.Options{Instance: "x", Token: secretToken,
		Jobs: []web.JobInfo{{Name: "a", Next: func(time.Time) time.Time { return time.Time{} }}}}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for path, body := range map[string]string{"/api/jobs/a/pause": "", "/api/jobs/a/trigger": "",
		"/api/jobs/a/backfill": `{"from":"` + past + `","to":"` + past + `"}`} {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secretToken)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 501 || !strings.Contains(string(b), `"error"`) {
			t.Fatalf("POST %s = %d %s, want 501", path, resp.StatusCode, b)
		}
	}
	code, page := get(t, srv, "/")
	if code != 200 || strings.Contains(page, "<button") || strings.Contains(page, `id="token"`) {
		t.Fatalf("page without controls shows controls:\n%s", page)
	}
	code, jobs := get(t, srv, "/api/jobs")
	if code != 200 || !strings.Contains(jobs, `"paused":null`) || !strings.Contains(jobs, `"next":null`) {
		t.Fatalf("/api/jobs = %d %s", code, jobs)
	}
	if code, body := get(t, srv, "/api/runs"); code != 501 {
		t.Fatalf("/api/runs without history = %d %s", code, body)
	}
	if code, body := get(t, srv, "/api/replicas"); code != 501 {
		t.Fatalf("/api/replicas without controls = %d %s", code, body)
	}
}

// GET /api/replicas lists the replicas whose announcement in the register
// has not expired, with when each last announced itself.
func TestReplicasAreTheAnnouncedOnes(t *testing.T) {
	e := newAPIEnv(t, secretToken, nil)
	for _, in := range []string{"replica-b", "replica-a"} {
		if err := e.controls.Announce(t.Context(), in, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.controls.Announce(t.Context(), "gone", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // past gone's expiry
	var got []control.Member
	e.call("GET", "/api/replicas", "", 200, &got)
	if len(got) != 2 || got[0].Instance != "replica-a" || got[1].Instance != "replica-b" ||
		time.Since(got[0].At) > time.Minute || got[0].At.After(time.Now()) {
		t.Fatalf("GET /api/replicas = %+v, want replica-a and replica-b, announced just now", got)
	}
}
