// Package web serves the replica's HTTP surface: /metrics, /healthz,
// /readyz and a small server-rendered status page at /.
package web

import (
	"context"
	"embed"
	"html/template"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/scheduler-dev/scheduler/internal/claim"
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
}).ParseFS(files, "status.html"))

// JobInfo describes one scheduled job for the page.
type JobInfo struct {
	Name, Schedule, Timezone string
	Next                     func(time.Time) time.Time
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
}

// Handler returns the HTTP handler.
func Handler(o Options) http.Handler {
	if o.Now == nil {
		o.Now = time.Now
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := o.Ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { o.status(w, r) })
	return mux
}

type jobRow struct {
	Name, Schedule, Timezone, LastStatus string
	Next                                 time.Time
}

type claimRow struct {
	claim.Record
	Remaining string
}

func (o Options) status(w http.ResponseWriter, r *http.Request) {
	now := o.Now()
	data := struct {
		Instance, Claimer, Error string
		Now                      time.Time
		Jobs                     []jobRow
		Runs                     []claim.Record
		Claims                   []claimRow
	}{Instance: o.Instance, Claimer: o.Claimer, Now: now}
	last := map[string]string{}
	if o.History != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		recs, err := o.History.History(ctx, "", 50)
		if err != nil {
			data.Error = "run history unavailable: " + err.Error()
		}
		data.Runs = recs
		for _, rec := range recs {
			if _, seen := last[rec.Job]; !seen {
				last[rec.Job] = string(rec.Status)
			}
			if rec.Status == claim.Running && rec.LeaseUntil.After(now) {
				data.Claims = append(data.Claims, claimRow{Record: rec, Remaining: rec.LeaseUntil.Sub(now).Round(100 * time.Millisecond).String()})
			}
		}
	}
	for _, j := range o.Jobs {
		data.Jobs = append(data.Jobs, jobRow{Name: j.Name, Schedule: j.Schedule, Timezone: j.Timezone,
			Next: j.Next(now), LastStatus: last[j.Name]})
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := page.Execute(w, data); err != nil && o.Logger != nil {
		o.Logger.WarnContext(r.Context(), "status page render failed", "error", err.Error())
	}
}
