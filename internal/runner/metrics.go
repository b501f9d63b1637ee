package runner

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Metrics are the runner's Prometheus families (DESIGN.md, "Metrics"). A nil
// *Metrics records nothing.
type Metrics struct {
	claims        *prometheus.CounterVec
	claimDuration *prometheus.HistogramVec
	runs          *prometheus.CounterVec
	runDuration   *prometheus.HistogramVec
	lag           *prometheus.HistogramVec
	renewals      *prometheus.CounterVec
	skips         *prometheus.CounterVec
	dataLoss      *prometheus.CounterVec
	missedRuns    *prometheus.CounterVec
	lastSuccess   *prometheus.GaugeVec
	held          *prometheus.GaugeVec
	conflicts     *prometheus.CounterVec
	replicas      prometheus.Gauge
	takeoversHeld *prometheus.GaugeVec

	mu   sync.Mutex
	last map[string]float64 // lastSuccess's values, to keep it from going back
}

// NewMetrics registers the runner's families with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		last: map[string]float64{},
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_claims_total", Help: "Claim attempts by result: won, held, done, error.",
		}, []string{"job", "claimer", "result"}),
		claimDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "scheduler_claim_duration_seconds", Help: "Latency of one claim round trip.",
			// From 50µs: in-process and loopback claims are sub-millisecond.
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
		}, []string{"claimer"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_runs_total", Help: "Runs executed on this replica by final status.",
		}, []string{"job", "status"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "scheduler_run_duration_seconds", Help: "Handler duration.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 4, 12),
		}, []string{"job"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "scheduler_schedule_lag_seconds", Help: "Scheduled instant to handler start, on this replica's clock.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16),
		}, []string{"job"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_lease_renewals_total", Help: "Lease renewals by result: ok, lost, error.",
		}, []string{"claimer", "result"}),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_runs_skipped_total", Help: "Runs this replica did not execute, by reason.",
		}, []string{"job", "reason"}),
		dataLoss: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_claimer_data_loss_total",
			Help: "Times the claimer's backend was found to have lost its data (a Redis server restarted empty); it then holds every run for a lease.",
		}, []string{"claimer"}),
		missedRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_runs_missed_total",
			Help: "Runs that passed their deadline before any replica could start them, by reason: no_replica, backend_unavailable, fell_behind. Counted by the one replica that recorded each.",
		}, []string{"job", "reason"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scheduler_job_last_success_timestamp_seconds",
			Help: "When the newest succeeded run of the job this replica knows of finished (unix seconds); take the max over replicas for freshness alerts.",
		}, []string{"job"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scheduler_runs_held",
			Help: "Runs this replica holds a claim on and executes now.",
		}, []string{"job"}),
		replicas: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_replicas",
			Help: "Replicas up, this one included, as it last read the backend's membership (0 until a read succeeded); replicas that disagree for long are not reading the same backend.",
		}),
		takeoversHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scheduler_takeovers_held",
			Help: "1 while this replica's claimer takes no lapsed lease over because it has just started or its backend lately left calls unanswered (a stall, an outage): a dead holder's runs wait until the backend has answered for a lease, so that a live holder's release lands first.",
		}, []string{"claimer"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_schedule_conflicts_total",
			Help: "Other versions of a job's schedule (spec, time zone, jitter) this replica found live beside its own: a rollout in progress, or a replica left on an old config. Counted once per job and other version.",
		}, []string{"job"}),
	}
	reg.MustRegister(m.claims, m.claimDuration, m.runs, m.runDuration, m.lag, m.renewals, m.skips, m.dataLoss,
		m.missedRuns, m.lastSuccess, m.held, m.conflicts, m.replicas, m.takeoversHeld)
	return m
}

func (m *Metrics) claimed(job, claimer string, err error, d time.Duration) {
	if m == nil {
		return
	}
	result := "error"
	switch {
	case err == nil:
		result = "won"
	case errors.Is(err, claim.ErrHeld):
		result = "held"
	case errors.Is(err, claim.ErrDone):
		result = "done"
	case errors.Is(err, errClosing):
		return
	}
	m.claims.WithLabelValues(job, claimer, result).Inc()
	m.claimDuration.WithLabelValues(claimer).Observe(d.Seconds())
}

func (m *Metrics) holdingTakeovers(claimer string, held bool) {
	if m == nil {
		return
	}
	v := 0.0
	if held {
		v = 1
	}
	m.takeoversHeld.WithLabelValues(claimer).Set(v)
}

func (m *Metrics) replicasSeen(n int) {
	if m != nil {
		m.replicas.Set(float64(n))
	}
}

// ready creates the series a dashboard or an alert reads before anything
// happened, at zero: "no data" reads as a broken scrape, and a rate over
// a series that appears at its first increment misses that increment.
func (m *Metrics) ready(claimer string) {
	if m == nil {
		return
	}
	m.dataLoss.WithLabelValues(claimer)
}

func (m *Metrics) dataLost(claimer string) {
	if m == nil {
		return
	}
	m.dataLoss.WithLabelValues(claimer).Inc()
}

func (m *Metrics) renewed(claimer string, err error) {
	if m == nil {
		return
	}
	result := "ok"
	switch {
	case errors.Is(err, claim.ErrLeaseLost):
		result = "lost"
	case err != nil:
		result = "error"
	}
	m.renewals.WithLabelValues(claimer, result).Inc()
}

func (m *Metrics) started(job string, lag time.Duration) {
	if m != nil {
		m.lag.WithLabelValues(job).Observe(max(lag, 0).Seconds())
	}
}

func (m *Metrics) finished(job string, status claim.Status, d time.Duration) {
	if status == claim.Succeeded {
		m.succeeded(job, time.Now())
	}
	if m != nil {
		m.runs.WithLabelValues(job, string(status)).Inc()
		m.runDuration.WithLabelValues(job).Observe(d.Seconds())
	}
}

// holding counts a run held and executed here while it lasts: it returns
// what to call when it ends.
func (m *Metrics) holding(job string) func() {
	if m == nil {
		return func() {}
	}
	g := m.held.WithLabelValues(job)
	g.Inc()
	return g.Dec
}

// missed counts n runs of job recorded missed for cause, in
// scheduler_runs_missed_total{reason=cause} and, as DESIGN.md names a
// run its misfire policy ended, scheduler_runs_skipped_total{reason="misfire"}.
func (m *Metrics) missed(job, cause string, n int) {
	if m != nil {
		m.missedRuns.WithLabelValues(job, cause).Add(float64(n))
		m.skips.WithLabelValues(job, ReasonMisfire).Add(float64(n))
	}
}

// succeeded moves job's last success forward to at; never back.
func (m *Metrics) succeeded(job string, at time.Time) {
	if m == nil || at.IsZero() {
		return
	}
	g := m.lastSuccess.WithLabelValues(job)
	m.mu.Lock()
	defer m.mu.Unlock()
	if v := float64(at.UnixNano()) / 1e9; v > m.last[job] {
		m.last[job] = v
		g.Set(v)
	}
}

func (m *Metrics) conflict(job string) {
	if m != nil {
		m.conflicts.WithLabelValues(job).Inc()
	}
}

func (m *Metrics) skipped(job, reason string) {
	if m != nil {
		m.skips.WithLabelValues(job, reason).Inc()
	}
}

// ClaimsCounter exposes scheduler_claims_total for tests and embedders.
func (m *Metrics) ClaimsCounter() *prometheus.CounterVec { return m.claims }
