package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/internal/tracing"
	"github.com/scheduler-dev/scheduler/internal/web"
	"github.com/scheduler-dev/scheduler/job"
)

func sortStrings(s []string) { slices.Sort(s) }

// runnerJobs turns the enabled configured jobs into runner jobs, once their
// params pass checkParams; file is the configuration's, for errors.
func (e *env) runnerJobs(cfg *config.Config, file string) ([]runner.Job, []web.JobInfo, error) {
	if err := e.checkParams(cfg, file); err != nil {
		return nil, nil, err
	}
	var out []runner.Job
	var info []web.JobInfo
	for _, name := range sortedJobs(cfg) {
		j := cfg.Jobs[name]
		if !j.Enabled {
			continue
		}
		s, err := schedule.Parse(j.Schedule, j.Timezone)
		if err != nil {
			return nil, nil, fmt.Errorf("jobs.%s.schedule: %w", name, err)
		}
		h, _ := e.reg.Lookup(name)
		out = append(out, runner.Job{Name: name, Schedule: s, Handler: h, Timeout: j.Timeout.Duration(),
			Overlap: j.Overlap, MaxAttempts: j.MaxAttempts, Misfire: j.Misfire.Policy, Grace: j.Misfire.Grace.Duration(),
			MaxCatchup: j.Misfire.MaxCatchup, Jitter: j.Jitter.Duration(), Params: j.Params})
		if j.Retry.Enabled() {
			rj := &out[len(out)-1]
			rj.Backoff, rj.MaxBackoff = j.Retry.Backoff.Duration(), j.Retry.MaxBackoff.Duration()
		}
		info = append(info, web.JobInfo{Name: name, Schedule: j.Schedule, Timezone: s.Location().String(), Next: s.Next, Parsed: s, Jitter: j.Jitter.Duration(), MaxAttempts: j.MaxAttempts})
	}
	return out, info, nil
}

// checkParams checks the params of every enabled job against the ones its
// handler declares (job.Registry.CheckParams), so that a bad value is a
// configuration error before anything runs rather than a failure of every
// run. Jobs without a handler are left to Validate, and handlers that
// declare nothing accept any params. It returns every problem, joined, each
// a *config.Error in file ("" for the built-in configuration).
func (e *env) checkParams(cfg *config.Config, file string) error {
	var errs []error
	for _, name := range enabledJobs(cfg) {
		err := e.reg.CheckParams(name, cfg.Jobs[name].Params)
		if err == nil {
			continue
		}
		all := []error{err}
		var joined interface{ Unwrap() []error }
		if errors.As(err, &joined) {
			all = joined.Unwrap()
		}
		for _, one := range all {
			var pe *job.ParamError
			if errors.As(one, &pe) {
				one = &config.Error{File: file, Key: pe.ConfigKey(), Value: pe.Value, Msg: pe.Msg}
			}
			errs = append(errs, one)
		}
	}
	return errors.Join(errs...)
}

// runnerOptions are the runner's settings from cfg, on backend b.
func runnerOptions(cfg *config.Config, b *claimers.Backend, log *slog.Logger, m *runner.Metrics) runner.Options {
	ttl, key := forgets(cfg)
	return runner.Options{Claimer: b.Claimer, Controls: control.New(b.Controls, nil),
		ClaimerName: cfg.Claimer.Kind, Instance: cfg.InstanceID,
		Lease: cfg.Claimer.Lease.Duration(), RenewEvery: cfg.Claimer.RenewEvery.Duration(),
		MaxClockSkew: cfg.Claimer.MaxClockSkew.Duration(), ShutdownGrace: cfg.ShutdownGrace.Duration(),
		Logger: log, Metrics: m, Forgets: ttl, ForgetsKey: key}
}

func (e *env) run(args []string) int {
	fs, path := e.flags("run", "[--config FILE] [--check]")
	check := fs.Bool("check", false, "validate the configuration and exit")
	if code, ok := e.parseNoArgs(fs, args); !ok {
		return code
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	jobsList, info, err := e.runnerJobs(cfg, *path)
	if err != nil {
		e.configError(err)
		return ExitUsage
	}
	if *check {
		fmt.Fprintf(e.stdout, "configuration ok: claimer %s, %d jobs enabled\n", cfg.Claimer.Kind, len(jobsList))
		if len(jobsList) == 0 {
			fmt.Fprintln(e.stdout, "note: with no job enabled, this replica claims nothing")
		}
		return ExitOK
	}
	log := newLogger(cfg, e.stderr)
	tracer, flushTraces, err := tracing.Setup(context.Background(), "scheduler", cfg.InstanceID)
	if err != nil {
		log.Error("invalid tracing settings", "error", err.Error())
		return ExitUsage
	}
	tracing.LogErrors(log)
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := flushTraces(fctx); err != nil {
			log.Warn("cannot flush traces", "error", err.Error())
		}
	}()

	// The first SIGTERM, SIGINT or SIGHUP (a terminal or ssh session
	// that closed) starts a graceful shutdown, said in the log; a second
	// one exits at once.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		select {
		case sig := <-sigs:
			signal.Stop(sigs) // restore default handling: the next signal kills the process
			log.Info("shutdown requested: no new runs; the runs in flight finish or are handed back",
				"signal", sig.String(), "shutdown_grace", cfg.ShutdownGrace.Duration().String(), "again", "a second signal exits at once")
			stop()
		case <-ctx.Done():
		}
	}()

	// The HTTP surface comes up first: while the replica waits for its
	// backend, probes see it alive and not ready, and a taken address
	// fails the start at once rather than after the wait.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := runner.NewMetrics(reg)
	var (
		srv     *http.Server
		ln      net.Listener
		handler lateHandler
		served  = make(chan error, 1)
	)
	if cfg.HTTP.Addr != "" {
		ln, err = net.Listen("tcp", cfg.HTTP.Addr)
		if err != nil {
			log.Error("cannot listen on http.addr", "addr", cfg.HTTP.Addr, "error", err.Error())
			return ExitRuntime
		}
		handler.set(web.Starting(reg))
		srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: &handler}
		go func() { served <- srv.Serve(ln) }()
		defer shutdownHTTP(srv) // the early returns; a no-op after the one below
	}

	b, err := openReplicaBackend(ctx, cfg, log)
	switch {
	case err != nil && ctx.Err() != nil:
		log.Info("scheduler stopped before its claimer backend answered")
		return ExitOK
	case err != nil:
		log.Error("cannot open claimer backend", "claimer", cfg.Claimer.Kind, "error", err.Error())
		return ExitRuntime
	}
	defer b.Close()

	closeJobs, err := e.openJobs(ctx, cfg, reg, enabledJobs(cfg)...)
	if err != nil {
		log.Error("cannot open a job", "database", cfg.Database.Kind, "error", err.Error())
		return ExitRuntime
	}
	defer closeJobs()
	opts := runnerOptions(cfg, b, log, metrics)
	opts.Tracer = tracer.Tracer("github.com/scheduler-dev/scheduler/internal/runner")
	r, err := runner.New(opts, jobsList)
	if err != nil {
		log.Error("invalid runner settings", "error", err.Error())
		return ExitUsage
	}

	var ws *web.Server
	if srv != nil {
		// Shutting down, a replica is not ready whatever its backend
		// says: it refuses new work (the API's "this replica is shutting
		// down") while its runs in flight drain, and a load balancer that
		// follows /readyz should stop sending it any.
		ready := func(rctx context.Context) error {
			if ctx.Err() != nil {
				return errors.New("shutting down: no new runs; the runs in flight finish or are handed back")
			}
			return b.Ready(rctx)
		}
		ws = web.New(web.Options{
			Instance: cfg.InstanceID, Claimer: cfg.Claimer.Kind, Jobs: info, History: b.Claimer,
			Ready: ready, Gatherer: reg, Logger: log,
			Controls: control.New(b.Controls, nil), Token: string(cfg.HTTP.Token), Backfill: withGrace(r.Backfill, cfg.ShutdownGrace.Duration()), CheckBackfill: r.CheckBackfill,
			BaseContext: ctx})
		handler.set(ws)
	}

	log.Info("scheduler started", "claimer", cfg.Claimer.Kind, "jobs", len(jobsList), "http", ln != nil && srv != nil,
		"http_addr", listenAddr(ln), "version", version())
	if len(jobsList) == 0 {
		log.Warn("no job is enabled: this replica claims nothing", "config", *path)
	}
	// The HTTP server stays up through the runner's shutdown grace, so
	// probes and scrapes still answer; it closes once the runner returns.
	g, gctx := errgroup.WithContext(ctx)
	runnerDone := make(chan struct{})
	g.Go(func() error { defer close(runnerDone); return r.Run(gctx) })
	if b.Lost != nil {
		// A claimer that stopped for good (a SQLite file deleted or
		// replaced) never claims again in this process: stop, exit 1, and
		// let the supervisor start a process that opens what the path
		// names now, rather than stay up doing nothing, alive to every
		// probe (found by an outside review).
		g.Go(func() error {
			select {
			case <-b.Lost:
				return fmt.Errorf("claimer: %w", b.LostErr())
			case <-gctx.Done():
				return nil
			}
		})
	}
	if srv != nil {
		g.Go(func() error {
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		g.Go(func() error { <-runnerDone; _ = ws.Close(); shutdownHTTP(srv); return nil })
	}
	if err := g.Wait(); err != nil {
		log.Error("scheduler stopped", "error", err.Error())
		return ExitRuntime
	}
	log.Info("scheduler stopped")
	return ExitOK
}

// openReplicaBackend opens the backend a replica runs on, applying
// migrations where configured. A server that cannot be reached yet (it
// refuses the connection, its name does not resolve, the dial times out:
// a database restarting with the fleet, a deploy in the wrong order) is
// asked again, with backoff, for two leases: a replica that cannot reach
// its backend recovers by itself (DESIGN's guarantee 6), where it used to
// exit 1 at once with migrations on, and wait with them off (found by an
// outside review). A backend still out of reach after that, or any other
// failure (a wrong password, a certificate, a SQLite path), ends it with
// the error, exit 1: asking again would not mend those, and an
// orchestrator's restart says more than a replica waiting in silence.
func openReplicaBackend(ctx context.Context, cfg *config.Config, log *slog.Logger) (*claimers.Backend, error) {
	window := 2 * cfg.Claimer.Lease.Duration()
	deadline := time.Now().Add(window)
	for attempt := 0; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		b, err := openBackend(octx, cfg, true)
		cancel()
		if err == nil || ctx.Err() != nil || !unreachable(err) || time.Now().After(deadline) {
			return b, err
		}
		if attempt == 0 {
			log.Error("cannot reach claimer backend; retrying", "claimer", cfg.Claimer.Kind, "for", window.String(), "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(time.Until(deadline), time.Second<<min(attempt, 4))):
		}
	}
}

// unreachable reports whether err says a server could not be dialled
// (refused, unresolved, unroutable, timed out) or is not serving yet
// (loading its data set, answering past the timeout). The
// claimers keep the network error in the chain (PostgreSQL) or only in
// the text (Redis flattens it, so that a client's own timeout never reads
// as the caller's deadline): both are looked at. A dial that succeeded
// and failed later (a TLS handshake, a wrong password) is not this.
func unreachable(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	if errors.As(err, &op) && op.Op == "dial" || errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	msg := err.Error()
	if strings.Contains(msg, "LOADING") || strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "context deadline exceeded") {
		// A server still loading its data set, or one that answers
		// too slowly (a Redlock majority of them, at start): it will
		// come (code review).
		return true
	}
	return strings.Contains(msg, "dial tcp") && (strings.Contains(msg, "connection refused") ||
		strings.Contains(msg, "no such host") || strings.Contains(msg, "network is unreachable") || strings.Contains(msg, "no route to host"))
}

// lateHandler serves one handler until set replaces it: the replica's
// HTTP surface while it starts, then the full one.
type lateHandler struct {
	mu sync.RWMutex
	h  http.Handler
}

func (l *lateHandler) set(h http.Handler) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.h = h
}

func (l *lateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.RLock()
	h := l.h
	l.mu.RUnlock()
	h.ServeHTTP(w, r)
}

func shutdownHTTP(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
}

func listenAddr(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// withGrace gives the handlers of the backfills the API starts on a
// replica its shutdown_grace when it stops, as its scheduled runs get
// (an outside review saw an API backfill's run handed back 3ms after
// SIGTERM, under a grace of 5s).
func withGrace(backfill func(context.Context, string, runner.BackfillOptions) ([]runner.BackfillItem, runner.BackfillSummary, error),
	grace time.Duration) func(context.Context, string, runner.BackfillOptions) ([]runner.BackfillItem, runner.BackfillSummary, error) {
	return func(ctx context.Context, job string, o runner.BackfillOptions) ([]runner.BackfillItem, runner.BackfillSummary, error) {
		o.Grace = grace
		return backfill(ctx, job, o)
	}
}
