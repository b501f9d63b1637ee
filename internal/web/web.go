// Package web serves the replica's HTTP surface: /metrics, /healthz,
// /readyz, a small server-rendered status page at /, and the operator's
// JSON API under /api/ (see api.go).
package web

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
)

//go:embed status.html
var files embed.FS

var page = template.Must(template.New("status.html").Funcs(template.FuncMap{
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	// instant is a run's instant: to the second for a scheduled run, to
	// the nanosecond for a manual one (a request, a rerun; the page
	// marks it), whose instant is its request's time: shown to the
	// second beside the scheduled run of that second, it read as one run
	// recorded twice (an outside review).
	"instant": func(at time.Time) string {
		if !control.Manual(claim.Run{At: at}) {
			return at.UTC().Format("2006-01-02 15:04:05Z")
		}
		return at.UTC().Format("2006-01-02 15:04:05.000000000Z")
	},
	"manual": func(at time.Time) bool { return control.Manual(claim.Run{At: at}) },
	// clock is t's time of day, with its date too when ref is on
	// another day.
	"clock": func(t, ref time.Time) string {
		t, ref = t.UTC(), ref.UTC()
		if t.YearDay() == ref.YearDay() && t.Year() == ref.Year() {
			return t.Format("15:04:05Z")
		}
		return t.Format("2006-01-02 15:04:05Z")
	},
}).ParseFS(files, "status.html"))

// JobInfo describes one scheduled job for the page.
type JobInfo struct {
	Name, Schedule, Timezone string
	Next                     func(time.Time) time.Time
	// Parsed is the parsed Schedule; with Jitter it gives each run's
	// start (schedule.Jittered). Nil: starts are not shown.
	Parsed *schedule.Schedule
	// Jitter is the job's jitter; 0 for none.
	Jitter time.Duration
	// MaxAttempts is the job's max_attempts, shown beside a run's
	// attempt; 0 if unknown.
	MaxAttempts int
}

// Options configure the handler.
type Options struct {
	Instance string
	Claimer  string // kind, never its address or credentials
	Jobs     []JobInfo
	History  claim.Claimer // its History fills the page; nil: no run history
	// Ready reports whether the backend is reachable and migrated.
	Ready    func(ctx context.Context) error
	Gatherer prometheus.Gatherer
	Logger   *slog.Logger
	Now      func() time.Time

	// Controls is the operator's state in the backend: pauses and run
	// requests, and the failed attempts of runs that retry. nil: the
	// API's control calls answer 501, and the page shows no buttons and
	// runs without their failed attempts.
	Controls *control.Store
	// Token is the bearer token the API's mutating calls require. Empty
	// turns them off (403). It is never logged nor rendered.
	Token string
	// Backfill runs a backfill on this replica (a Runner's Backfill).
	// nil: the API's backfill calls answer 501.
	Backfill func(ctx context.Context, job string, o runner.BackfillOptions) ([]runner.BackfillItem, runner.BackfillSummary, error)
	// CheckBackfill says what is wrong with a backfill before it starts
	// (a Runner's CheckBackfill): its error answers 400. nil: checked
	// only as Backfill runs.
	CheckBackfill func(job string, o runner.BackfillOptions) error
	// BaseContext bounds the backfills the API starts (default
	// context.Background()); Server.Close also stops them.
	BaseContext context.Context
}

// recentRecords is how many of the newest records (of every job) the page
// and GET /api/jobs read to find each job's last status, last success and
// missed runs.
const recentRecords = 500

// pageRuns is how many of them the page lists.
const pageRuns = 50

// Server is the HTTP handler. Close stops the backfills its API started.
type Server struct {
	o   Options
	mux *http.ServeMux

	ctx    context.Context // backfills run under it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	backfills map[string]*backfill
	finished  []string // ids of finished backfills, oldest first
}

// Handler returns the HTTP handler. Backfills it starts stop when
// o.BaseContext is done; use New for a Server that can also be closed.
func Handler(o Options) http.Handler { return New(o) }

// New returns the HTTP handler as a Server.
func New(o Options) *Server {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	base := o.BaseContext
	if base == nil {
		base = context.Background()
	}
	s := &Server{o: o, mux: http.NewServeMux(), backfills: map[string]*backfill{}}
	s.ctx, s.cancel = context.WithCancel(base)
	mux := s.mux
	if o.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if o.Ready == nil {
			_, _ = w.Write([]byte("ready\n"))
			return
		}
		const within = 2 * time.Second
		ctx, cancel := context.WithTimeout(r.Context(), within)
		defer cancel()
		if err := o.Ready(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil {
				// A client's own retries (go-redis dials again with a
				// backoff) can outlast the probe: say what that means.
				err = fmt.Errorf("backend unavailable: no answer within %v (%w)", within, err)
			}
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /{$}", s.status)
	s.routes()
	return s
}

// Starting is the HTTP surface of a replica still waiting for its claimer
// backend: alive (/healthz), not ready (/readyz, 503, saying why), its
// metrics, and 503 for everything else. A liveness probe that found
// nothing listening would restart the replica during a wait meant to
// outlast a backend's own restart.
func Starting(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	if g != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	const starting = "not ready: starting: waiting for the claimer backend"
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, starting, http.StatusServiceUnavailable)
	})
	// The API answers JSON, errors included, from the start: a client
	// parses every answer it gets (an outside review found plain text).
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusServiceUnavailable, starting)
	})
	return mux
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close stops the backfills the API started and waits for them; later
// ones are refused.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// jobState is what the page and GET /api/jobs say of one job.
type jobState struct {
	Name, Schedule, Timezone string
	Next                     time.Time
	Start                    time.Time // Next's start under the job's jitter; zero without
	LastStatus               claim.Status
	LastSuccess              time.Time
	Missed                   int
	Pause                    *control.Pause // the switch governing it, nil if never set
}

// snapshot reads the recent history and the pause switches once.
type snapshot struct {
	Jobs   []jobState
	Recent []claim.Record
	Errors []string
}

func (s *Server) snapshot(ctx context.Context, now time.Time) snapshot {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var snap snapshot
	type seen struct {
		last bool
		st   jobState
	}
	per := map[string]*seen{}
	if s.o.History != nil {
		recs, err := s.o.History.History(ctx, "", recentRecords)
		if err != nil {
			snap.Errors = append(snap.Errors, "run history unavailable: "+err.Error())
		}
		snap.Recent = recs
		for _, rec := range recs {
			j := per[rec.Job]
			if j == nil {
				j = &seen{}
				per[rec.Job] = j
			}
			if !j.last {
				j.last, j.st.LastStatus = true, rec.Status
			}
			if rec.Status == claim.Succeeded && rec.FinishedAt.After(j.st.LastSuccess) {
				j.st.LastSuccess = rec.FinishedAt
			}
			if rec.Status == claim.Missed {
				j.st.Missed++
			}
		}
	}
	var pauses control.Pauses
	if s.o.Controls != nil {
		var err error
		if pauses, err = s.o.Controls.Pauses(ctx); err != nil {
			snap.Errors = append(snap.Errors, "pause switches unavailable: "+err.Error())
		}
	}
	for _, j := range s.o.Jobs {
		st := jobState{}
		if p := per[j.Name]; p != nil {
			st = p.st
		}
		st.Name, st.Schedule, st.Timezone = j.Name, j.Schedule, j.Timezone
		if j.Next != nil {
			st.Next = j.Next(now)
		}
		if !st.Next.IsZero() {
			st.Start = j.start(st.Next)
		}
		if p, ok := pauses.Of(j.Name); ok {
			st.Pause = &p
		}
		snap.Jobs = append(snap.Jobs, st)
	}
	return snap
}

type claimRow struct {
	Run
	Remaining string // of the lease, or until the retry pending
}

// attempts reads the failed attempts of the runs whose id starts with
// prefix; none without a control store.
func (s *Server) attempts(ctx context.Context, prefix string) ([]control.Attempt, error) {
	if s.o.Controls == nil {
		return nil, nil
	}
	return s.o.Controls.Attempts(ctx, prefix)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	now := s.o.Now()
	snap := s.snapshot(r.Context(), now)
	data := struct {
		Instance, Claimer string
		Errors            []string
		Now               time.Time
		Jobs              []jobState
		Runs              []Run
		Claims            []claimRow
		Controls, APIOn   bool
	}{Instance: s.o.Instance, Claimer: s.o.Claimer, Now: now, Errors: snap.Errors, Jobs: snap.Jobs,
		Controls: s.o.Controls != nil, APIOn: s.o.Token != ""}
	actx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	atts, err := s.attempts(actx, "")
	cancel()
	if err != nil {
		data.Errors = append(data.Errors, "failed attempts unavailable: "+err.Error())
	}
	runs := Runs(snap.Recent, atts, s.o.Jobs)
	data.Runs = runs[:min(len(runs), pageRuns)]
	for _, run := range runs {
		if run.Status == claim.Running && run.LeaseUntil.After(now) {
			until := run.LeaseUntil
			if run.RetryPending != nil {
				until = run.RetryPending.At
			}
			data.Claims = append(data.Claims, claimRow{Run: run, Remaining: until.Sub(now).Round(100 * time.Millisecond).String()})
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := page.Execute(w, data); err != nil {
		s.o.Logger.WarnContext(r.Context(), "status page render failed", "error", err.Error())
	}
}
