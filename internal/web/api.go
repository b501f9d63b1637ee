// This file is the operator's JSON API: reading jobs and runs, pausing,
// resuming and triggering jobs through the control store, and backfills
// run on this replica. Calls that change anything need the bearer token.

package web

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
)

// Limits of the API.
const (
	maxBody              = 64 << 10
	defaultRunsLimit     = 50
	maxRunsLimit         = 1000
	maxBackfillsKept     = 100             // finished backfills remembered
	publishEvery         = 2 * time.Second // a running backfill's state, to the control store
	publishTimeout       = 5 * time.Second
	maxBackfillsRunning  = 8
	maxBackfillParallel  = 64
	apiOffMessage        = "the API's mutating calls are off: set http.token or http.token_file"
	controlsOffMessage   = "this replica has no control store"
	backfillOffMessage   = "this replica cannot run backfills"
	historyOffMessage    = "this replica has no run history"
	shuttingDownMessage  = "this replica is shutting down"
	tooManyBackfillsText = "too many backfills running on this replica"
)

func (s *Server) routes() {
	routes := []struct {
		method, path string
		h            http.HandlerFunc
	}{
		{"GET", "/api/jobs", s.listJobs},
		{"GET", "/api/runs", s.listRuns},
		{"GET", "/api/replicas", s.listReplicas},
		{"POST", "/api/jobs/{job}/pause", s.mutating("pause", true, s.pause(true))},
		{"POST", "/api/jobs/{job}/resume", s.mutating("resume", true, s.pause(false))},
		{"POST", "/api/jobs/{job}/trigger", s.mutating("trigger", false, s.trigger)},
		{"POST", "/api/jobs/{job}/backfill", s.mutating("backfill", false, s.backfill)},
		{"GET", "/api/backfills/{id}", s.getBackfill},
	}
	for _, r := range routes {
		s.mux.HandleFunc(r.method+" "+r.path, r.h)
		// The mux's own 405 and 404 are plain text; an API client
		// parses every answer as JSON. Each path has one method.
		allow := r.method
		if allow == "GET" {
			allow = "GET, HEAD"
		}
		s.mux.HandleFunc(r.path, func(w http.ResponseWriter, req *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: method not allowed (allowed: %s)", req.Method, req.URL.Path, allow))
		})
	}
	s.mux.HandleFunc("/api/", func(w http.ResponseWriter, req *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such call: %s %s", req.Method, req.URL.Path))
	})
}

// apiError is an answer with a status and a message.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) *apiError {
	return &apiError{code, fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

// storeError maps a control store or backend error onto an answer.
func storeError(err error) *apiError {
	switch {
	case errors.Is(err, claim.ErrInvalid):
		return errorf(http.StatusBadRequest, "%s", err.Error())
	case errors.Is(err, claim.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return errorf(http.StatusServiceUnavailable, "%s", err.Error())
	case errors.Is(err, context.Canceled):
		return errorf(http.StatusServiceUnavailable, "request cancelled")
	}
	return errorf(http.StatusInternalServerError, "%s", err.Error())
}

func (s *Server) knownJob(name string) bool {
	return slices.ContainsFunc(s.o.Jobs, func(j JobInfo) bool { return j.Name == name })
}

// jobJSON is one job in GET /api/jobs.
type jobJSON struct {
	Name        string         `json:"name"`
	Schedule    string         `json:"schedule"`
	Timezone    string         `json:"timezone"`
	Next        *time.Time     `json:"next"`
	NextStarts  *time.Time     `json:"next_starts_at"` // under the job's jitter; null without
	Paused      *control.Pause `json:"paused"`
	LastStatus  *claim.Status  `json:"last_status"`
	LastSuccess *time.Time     `json:"last_success"`
	Missed      int            `json:"missed"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) {
	snap := s.snapshot(r.Context(), s.o.Now())
	if len(snap.Errors) > 0 {
		writeError(w, http.StatusServiceUnavailable, strings.Join(snap.Errors, "; "))
		return
	}
	out := make([]jobJSON, 0, len(snap.Jobs))
	for _, j := range snap.Jobs {
		jj := jobJSON{Name: j.Name, Schedule: j.Schedule, Timezone: j.Timezone, Next: timePtr(j.Next),
			NextStarts: timePtr(j.Start), Paused: j.Pause, LastSuccess: timePtr(j.LastSuccess), Missed: j.Missed}
		if j.LastStatus != "" {
			st := j.LastStatus
			jj.LastStatus = &st
		}
		out = append(out, jj)
	}
	writeJSON(w, http.StatusOK, out)
}

// listReplicas answers the replicas up as the backend's register lists
// them (the runner's view of its fleet, see control.Announce): the
// replicas that share this one's backend, and when each last announced
// itself.
func (s *Server) listReplicas(w http.ResponseWriter, r *http.Request) {
	if s.o.Controls == nil {
		writeError(w, http.StatusNotImplemented, controlsOffMessage)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	ms, err := s.o.Controls.Announcements(ctx)
	if err != nil {
		e := storeError(err)
		writeError(w, e.code, "replicas: "+e.msg)
		return
	}
	writeJSON(w, http.StatusOK, ms)
}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	if s.o.History == nil {
		writeError(w, http.StatusNotImplemented, historyOffMessage)
		return
	}
	q := r.URL.Query()
	job := q.Get("job")
	if job != "" && !s.knownJob(job) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("unknown job %q", job))
		return
	}
	limit := defaultRunsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit: %q is not a positive integer", v))
			return
		}
		limit = min(n, maxRunsLimit)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	recs, err := s.o.History.History(ctx, job, limit)
	if err != nil {
		e := storeError(err)
		writeError(w, e.code, "run history: "+e.msg)
		return
	}
	prefix := ""
	if job != "" {
		prefix = job + "@"
	}
	atts, err := s.attempts(ctx, prefix)
	if err != nil {
		e := storeError(err)
		writeError(w, e.code, "failed attempts: "+e.msg)
		return
	}
	writeJSON(w, http.StatusOK, Runs(recs, atts, s.o.Jobs))
}

// call is one mutating call as its handler sees it.
type call struct {
	action, job  string
	by, note, id string
	// given: the caller named the request id (body or header); else id
	// is a random one.
	given bool
	body  []byte
	// log carries extra attributes for the operator action's log line.
	log []any
}

// common are the fields every mutating call's body may carry.
type common struct {
	Note      string `json:"note"`
	By        string `json:"by"`
	RequestID string `json:"request_id"`
}

// mutating wraps a mutating call: it checks the token, the job (anyJob:
// "*" names every job), the caller's identity and request id, and logs
// the action once.
func (s *Server) mutating(action string, anyJob bool, h func(w http.ResponseWriter, r *http.Request, c *call) (int, any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if e := s.authorize(r); e != nil {
			if e.code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="scheduler"`)
				s.o.Logger.WarnContext(r.Context(), "operator API: unauthorized call", "action", action,
					"job", r.PathValue("job"), "remote", remoteIP(r))
			}
			writeError(w, e.code, e.msg)
			return
		}
		c := &call{action: action, job: r.PathValue("job"), by: "api@" + remoteIP(r), id: idHeader(r, action)}
		var code int
		var v any
		err := s.prepare(w, r, c, anyJob)
		if err == nil {
			w.Header().Set("X-Request-Id", c.id)
			code, v, err = h(w, r, c)
		}
		// by is whatever the caller says; remote is where the call came
		// from, whatever it says.
		attrs := append([]any{"action", action, "job", c.job, "by", c.by, "remote", remoteIP(r), "request_id", c.id, "note", c.note}, c.log...)
		if err != nil {
			var e *apiError
			if !errors.As(err, &e) {
				e = storeError(err)
			}
			code, v = e.code, map[string]string{"error": e.msg}
			attrs = append(attrs, "error", e.msg)
		}
		s.o.Logger.InfoContext(r.Context(), "operator action", append(attrs, "status", code)...)
		writeJSON(w, code, v)
	}
}

// prepare checks a mutating call's job and reads its body's common
// fields into c; c keeps its defaults for any that are invalid, so the
// log line never carries them.
func (s *Server) prepare(w http.ResponseWriter, r *http.Request, c *call, anyJob bool) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return errorf(http.StatusRequestEntityTooLarge, "body: larger than %d bytes", maxBody)
	}
	c.body = body
	var cm common
	if err := decodeLoose(body, &cm); err != nil {
		return err
	}
	id := firstSet(cm.RequestID, c.id)
	if err := control.CheckTexts(cm.Note, cm.By, id); err != nil {
		c.id = claim.NewToken()
		return errorf(http.StatusBadRequest, "%v", err)
	}
	if id != "" && strings.TrimSpace(id) == "" {
		c.id = claim.NewToken()
		return errorf(http.StatusBadRequest, "request_id: %q is blank", id)
	}
	c.given = id != ""
	c.note, c.by, c.id = cm.Note, firstSet(cm.By, c.by), firstSet(id, claim.NewToken())
	if !s.knownJob(c.job) && (!anyJob || c.job != control.AllJobs) {
		return errorf(http.StatusNotFound, "unknown job %q", c.job)
	}
	return nil
}

// firstSet is the first of vs that is not empty.
func firstSet(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// idHeader is the request id a header carries: Idempotency-Key (for a
// trigger) or X-Request-Id.
func idHeader(r *http.Request, action string) string {
	if action == "trigger" {
		if v := r.Header.Get("Idempotency-Key"); v != "" {
			return v
		}
	}
	return r.Header.Get("X-Request-Id")
}

// authorize checks the bearer token in constant time.
func (s *Server) authorize(r *http.Request) *apiError {
	if s.o.Token == "" {
		return errorf(http.StatusForbidden, "%s", apiOffMessage)
	}
	got := ""
	if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		got = strings.TrimSpace(tok)
	}
	// Hashing first makes the comparison's time independent of the lengths.
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(s.o.Token))
	if got == "" || subtle.ConstantTimeCompare(a[:], b[:]) != 1 {
		return errorf(http.StatusUnauthorized, "missing or wrong bearer token")
	}
	return nil
}

func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// decodeLoose reads the common fields of an optional JSON object body,
// ignoring the others (the call's own decode checks them).
func decodeLoose(body []byte, v any) error {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return jsonError(err)
	}
	return nil
}

// decodeStrict reads an optional JSON object body into v, refusing
// unknown fields.
func decodeStrict(body []byte, v any) error {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return errorf(http.StatusBadRequest, "body: more than one JSON value")
	}
	return nil
}

// jsonError names the field a decoding error is about.
func jsonError(err error) *apiError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return errorf(http.StatusBadRequest, "%s: want a JSON %s, not %s", te.Field, te.Type.Kind(), te.Value)
	case errors.As(err, &te):
		return errorf(http.StatusBadRequest, "body: want a JSON object, not %s", te.Value)
	case errors.As(err, &se):
		return errorf(http.StatusBadRequest, "body: invalid JSON: %s", se.Error())
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errorf(http.StatusBadRequest, "%s: unknown field", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return errorf(http.StatusBadRequest, "body: %s", err.Error())
}

func (s *Server) pause(paused bool) func(http.ResponseWriter, *http.Request, *call) (int, any, error) {
	return func(w http.ResponseWriter, r *http.Request, c *call) (int, any, error) {
		var body common
		if err := decodeStrict(c.body, &body); err != nil {
			return 0, nil, err
		}
		if s.o.Controls == nil {
			return 0, nil, errorf(http.StatusNotImplemented, "%s", controlsOffMessage)
		}
		p, err := s.o.Controls.SetPause(r.Context(), control.Pause{Job: c.job, Paused: paused, Note: c.note, By: c.by, RequestID: c.id})
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, p, nil
	}
}

// triggerAnswer is the answer of POST /api/jobs/{job}/trigger.
type triggerAnswer struct {
	Request control.Request `json:"request"`
	Created bool            `json:"created"`
	RunID   string          `json:"run_id"`
}

func (s *Server) trigger(w http.ResponseWriter, r *http.Request, c *call) (int, any, error) {
	var body struct {
		common
		Overlap string `json:"overlap"`
	}
	if err := decodeStrict(c.body, &body); err != nil {
		return 0, nil, err
	}
	if body.Overlap != "" && body.Overlap != "allow" {
		return 0, nil, errorf(http.StatusBadRequest, "overlap: %q: want \"\" or \"allow\"", body.Overlap)
	}
	if s.o.Controls == nil {
		return 0, nil, errorf(http.StatusNotImplemented, "%s", controlsOffMessage)
	}
	sent := control.Request{ID: c.id, Job: c.job, Note: c.note, By: c.by, Overlap: body.Overlap, Created: s.o.Now().UTC()}
	req, created, err := s.o.Controls.Request(r.Context(), sent)
	if err != nil {
		return 0, nil, err
	}
	// Store.Request tells its request from an earlier one by their run
	// instants, whole milliseconds: a retry within the same millisecond
	// would look created. Their creation times tell them apart.
	created = created && req.Created.Equal(sent.Created)
	if req.Job != c.job {
		return 0, nil, errorf(http.StatusConflict, "request_id %q already requested a run of job %q", c.id, req.Job)
	}
	a := triggerAnswer{Request: req, Created: created, RunID: req.Run().ID()}
	c.log = append(c.log, "run_id", a.RunID, "created", created)
	if !created {
		return http.StatusOK, a, nil
	}
	return http.StatusAccepted, a, nil
}

// backfill is one backfill the API started on this replica. Its state
// is published to the control store as it goes (publish), so that every
// replica's API answers for it: behind a load balancer, the call that
// asks after a backfill seldom reaches the replica that started it.
type backfill struct {
	ID         string                 `json:"id"`
	Job        string                 `json:"job"`
	By         string                 `json:"by"`
	RequestID  string                 `json:"request_id"`
	Replica    string                 `json:"replica"` // where it runs
	Done       bool                   `json:"done"`
	Summary    runner.BackfillSummary `json:"summary"`
	Error      *string                `json:"error"`
	StartedAt  time.Time              `json:"started_at"`
	FinishedAt time.Time              `json:"finished_at,omitzero"`
	// UpdatedAt is when the replica running it last wrote this state: a
	// backfill not done whose state stops moving lost its replica.
	UpdatedAt time.Time `json:"updated_at"`
}

func (s *Server) backfill(w http.ResponseWriter, r *http.Request, c *call) (int, any, error) {
	var body struct {
		common
		From          string `json:"from"`
		To            string `json:"to"`
		Rerun         string `json:"rerun"`
		MaxConcurrent int    `json:"max_concurrent"`
		NewestFirst   bool   `json:"newest_first"`
		DryRun        bool   `json:"dry_run"`
	}
	if err := decodeStrict(c.body, &body); err != nil {
		return 0, nil, err
	}
	o := runner.BackfillOptions{Rerun: body.Rerun, MaxConcurrent: body.MaxConcurrent, NewestFirst: body.NewestFirst, DryRun: body.DryRun}
	for _, f := range []struct {
		name, v string
		t       *time.Time
	}{{"from", body.From, &o.From}, {"to", body.To, &o.To}} {
		if f.v == "" {
			return 0, nil, errorf(http.StatusBadRequest, "%s: required (RFC 3339)", f.name)
		}
		t, err := time.Parse(time.RFC3339, f.v)
		if err != nil {
			return 0, nil, errorf(http.StatusBadRequest, "%s: %q is not an RFC 3339 time", f.name, f.v)
		}
		*f.t = t
	}
	switch {
	case o.To.Before(o.From):
		return 0, nil, errorf(http.StatusBadRequest, "to: %s is before from", body.To)
	case o.To.After(s.o.Now()):
		return 0, nil, errorf(http.StatusBadRequest, "to: %s is in the future; the replicas run what is due", body.To)
	case o.Rerun != "" && !slices.Contains(runner.RerunPolicies, o.Rerun):
		return 0, nil, errorf(http.StatusBadRequest, "rerun: %q: want %s", o.Rerun, strings.Join(runner.RerunPolicies, ", "))
	case o.MaxConcurrent < 0 || o.MaxConcurrent > maxBackfillParallel:
		return 0, nil, errorf(http.StatusBadRequest, "max_concurrent: %d: want 0 to %d", o.MaxConcurrent, maxBackfillParallel)
	}
	c.log = append(c.log, "from", body.From, "to", body.To, "rerun", o.Rerun, "dry_run", o.DryRun)
	if s.o.Backfill == nil {
		return 0, nil, errorf(http.StatusNotImplemented, "%s", backfillOffMessage)
	}
	if s.o.CheckBackfill != nil {
		// Refused now, not found out by whoever polls its status: a range
		// past what the backend remembers of finished runs would run them
		// again (an outside review re-ran six through this call).
		if err := s.o.CheckBackfill(c.job, o); err != nil {
			return 0, nil, backfillError(err)
		}
	}
	if o.DryRun {
		items, sum, err := s.o.Backfill(r.Context(), c.job, o)
		if err != nil {
			return 0, nil, backfillError(err)
		}
		if items == nil {
			items = []runner.BackfillItem{}
		}
		return http.StatusOK, struct {
			Items   []runner.BackfillItem  `json:"items"`
			Summary runner.BackfillSummary `json:"summary"`
		}{items, sum}, nil
	}

	b := &backfill{ID: claim.NewToken(), Job: c.job, By: c.by, RequestID: c.id, Replica: s.o.Instance,
		StartedAt: s.o.Now().UTC(), Summary: runner.BackfillSummary{Job: c.job}}
	s.mu.Lock()
	running := len(s.backfills) - len(s.finished)
	switch {
	case s.closed || s.ctx.Err() != nil:
		s.mu.Unlock()
		return 0, nil, errorf(http.StatusServiceUnavailable, "%s", shuttingDownMessage)
	case running >= maxBackfillsRunning:
		s.mu.Unlock()
		return 0, nil, errorf(http.StatusTooManyRequests, "%s (%d)", tooManyBackfillsText, running)
	}
	s.backfills[b.ID] = b
	s.wg.Add(1)
	s.mu.Unlock()
	if c.given && s.o.Controls != nil {
		// A retry of the call, on any replica, finds the backfill its
		// request id started instead of starting the range again: under
		// rerun all or failed that ran every instant twice (an outside
		// review sent one call twice). Recorded once this replica has
		// room for it, so that the id never names a backfill refused.
		got, created, err := s.o.Controls.StartBackfill(r.Context(), control.Backfill{RequestID: c.id, ID: b.ID,
			Replica: s.o.Instance, Job: c.job, Created: b.StartedAt})
		if err != nil || !created {
			s.mu.Lock()
			delete(s.backfills, b.ID)
			s.mu.Unlock()
			s.wg.Done()
		}
		switch {
		case err != nil:
			return 0, nil, err
		case got.Job != c.job:
			return 0, nil, errorf(http.StatusConflict, "request_id %q already started a backfill of job %q", c.id, got.Job)
		case !created:
			c.log = append(c.log, "backfill_id", got.ID, "created", false)
			return http.StatusOK, backfillAnswer{ID: got.ID, URL: "/api/backfills/" + got.ID, Replica: got.Replica}, nil
		}
	}
	c.log = append(c.log, "backfill_id", b.ID)
	s.publish(r.Context(), b)
	o.Progress = func(_ runner.BackfillItem, sum runner.BackfillSummary) {
		s.mu.Lock()
		b.Summary = sum
		s.mu.Unlock()
	}
	go func() {
		defer s.wg.Done()
		stop := make(chan struct{})
		published := make(chan struct{})
		go func() {
			defer close(published)
			s.publishWhileRunning(b, stop)
		}()
		_, sum, err := s.o.Backfill(s.ctx, b.Job, o)
		close(stop)
		<-published
		s.finish(b, sum, err)
		// The last state outlives the shutdown that may have ended it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), publishTimeout)
		defer cancel()
		s.publish(ctx, b)
	}()
	return http.StatusAccepted, backfillAnswer{ID: b.ID, URL: "/api/backfills/" + b.ID, Replica: s.o.Instance}, nil
}

// backfillAnswer answers a backfill started, or found by its request id:
// its status is at URL on Replica.
type backfillAnswer struct {
	ID      string `json:"id"`
	URL     string `json:"url"`
	Replica string `json:"replica"`
}

// finish records a backfill's end and forgets the oldest finished ones
// beyond maxBackfillsKept.
func (s *Server) finish(b *backfill, sum runner.BackfillSummary, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b.Done, b.Summary, b.FinishedAt = true, sum, s.o.Now().UTC()
	if err != nil {
		msg := err.Error()
		b.Error = &msg
	}
	s.o.Logger.Info("backfill finished", "job", b.Job, "backfill_id", b.ID, "request_id", b.RequestID,
		"planned", sum.Planned, "succeeded", sum.Succeeded, "failed", sum.Failed, "errors", sum.Errors,
		"error", errString(err))
	s.finished = append(s.finished, b.ID)
	for len(s.finished) > maxBackfillsKept {
		delete(s.backfills, s.finished[0])
		s.finished = s.finished[1:]
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// backfillError maps a runner's backfill error onto an answer: a backend
// failure (a wrapped error) is the server's, the runner's own complaints
// about the request are the caller's.
func backfillError(err error) error {
	switch {
	case errors.Is(err, claim.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return storeError(err)
	case errors.Unwrap(err) != nil:
		return errorf(http.StatusInternalServerError, "%s", err.Error())
	}
	return errorf(http.StatusBadRequest, "%s", err.Error())
}

// publish writes b's state to the control store, best effort: a replica
// that cannot write it still runs the backfill and answers for it itself.
func (s *Server) publish(ctx context.Context, b *backfill) {
	if s.o.Controls == nil {
		return
	}
	s.mu.Lock()
	b.UpdatedAt = s.o.Now().UTC()
	v := *b
	s.mu.Unlock()
	state, err := json.Marshal(v)
	if err == nil {
		err = s.o.Controls.PublishBackfill(ctx, v.ID, state, v.UpdatedAt)
	}
	if err != nil {
		s.o.Logger.Warn("backfill state not published", "job", v.Job, "backfill_id", v.ID, "err", err)
	}
}

// publishWhileRunning publishes b's state every publishEvery, until stop,
// whether or not its summary moved: updated_at is the heartbeat that
// tells a backfill whose replica is gone from one whose handler runs long
// (an outside review read a 40s item as a lost replica).
func (s *Server) publishWhileRunning(b *backfill, stop <-chan struct{}) {
	tick := time.NewTicker(publishEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, publishTimeout)
		s.publish(ctx, b)
		cancel()
	}
}

// getBackfill answers for a backfill this replica started, or else from
// the state its replica published (publish).
func (s *Server) getBackfill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	b, ok := s.backfills[id]
	var v backfill
	if ok {
		v = *b
	}
	s.mu.Unlock()
	if ok {
		writeJSON(w, http.StatusOK, v)
		return
	}
	if s.o.Controls != nil {
		state, found, err := s.o.Controls.BackfillState(r.Context(), id)
		switch {
		case err != nil:
			writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("backfill %q: not on this replica, and the control store did not answer: %v", id, err))
			return
		case found && json.Unmarshal(state, &v) == nil:
			writeJSON(w, http.StatusOK, v)
			return
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no backfill %q: not on this replica (it keeps its last %d finished), nor published by another in the last %s "+
		"(replicas of versions before the backfill state was published answer only for their own: ask the replica the backfill's answer named)",
		id, maxBackfillsKept, control.BackfillStateTTL))
}
