package benchkit

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

// ScaleOptions describe one scale scenario: Jobs jobs, all due at the same
// instant, on Replicas replicas, each with its own client.
type ScaleOptions struct {
	Kind     string
	Jobs     int           // default 10,000
	Replicas int           // default 3
	Lease    time.Duration // default 6s: losers re-check every 2s
	// Lead is how long before the instant the replicas start (default 3s):
	// the idle heap is measured in between.
	Lead time.Duration
	// Spread is runner.Options.Spread (0: the runner's default, negative:
	// none).
	Spread time.Duration
	// ReplicaCmd, when set, runs each replica as a process: the command
	// and leading arguments of a program that calls ReplicaMain (see
	// cmd/scheduler-bench -replica). Not for memory.
	ReplicaCmd []string
	// Timeout bounds the wait for every run to start and every loser to
	// see it done (default 2 minutes).
	Timeout time.Duration
}

func (o *ScaleOptions) defaults() {
	o.Jobs = max(o.Jobs, 0)
	if o.Jobs == 0 {
		o.Jobs = 10_000
	}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	if o.Lease == 0 {
		o.Lease = 6 * time.Second
	}
	if o.Lead == 0 {
		o.Lead = 3 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
}

// Scale is what one scale scenario measured.
type Scale struct {
	Claimer  string `json:"claimer"`
	Jobs     int    `json:"jobs"`
	Replicas int    `json:"replicas"`
	Spread   string `json:"spread"`
	// Processes says whether the replicas ran as separate processes.
	Processes bool `json:"processes"`
	// Schedule lag: instant → handler start, on the starting replica.
	LagP50ms float64 `json:"lag_p50_ms"`
	LagP99ms float64 `json:"lag_p99_ms"`
	LagMaxms float64 `json:"lag_max_ms"`
	// CallsPerRun counts Claimer calls (claim, renew, release) of every
	// replica per run, until every loser has seen its run done.
	CallsPerRun float64 `json:"calls_per_run"`
	// CPUPerRunus is this process's CPU time (user+system, all replicas and
	// in-process backends such as SQLite) per run over the same span.
	CPUPerRunus float64 `json:"cpu_per_run_us"`
	// HeapPerJob is the HeapInuse growth per scheduled job per replica, at
	// idle before the instant: job definitions and runner state.
	HeapPerJob float64 `json:"heap_per_job_bytes"`
	// Shares is how many runs each replica executed; Fairness is max/min
	// (0 when a replica executed none).
	Shares     []int   `json:"shares"`
	Fairness   float64 `json:"fairness"`
	Duplicates int     `json:"duplicates"`
	Missing    int     `json:"missing"`
	Error      string  `json:"error,omitempty"`
}

// counting wraps a Claimer and counts its calls: a Claim or Release of
// many runs is one call, as it is one request.
type counting struct {
	claim.Claimer
	calls *atomic.Int64
}

// TakeoversHeld and WatchLoss pass the claimer's on, so that the runner
// over the counter runs as it does over the claimer in production.
func (c counting) TakeoversHeld(lease time.Duration) bool { return claim.HeldBy(c.Claimer, lease) }

func (c counting) WatchLoss(report func(*claim.DataLossError)) { claim.WatchLossOf(c.Claimer, report) }

func (c counting) Claim(ctx context.Context, runs []claim.Run, lease time.Duration) ([]*claim.Claim, []error) {
	c.calls.Add(1)
	return c.Claimer.Claim(ctx, runs, lease)
}

func (c counting) Renew(ctx context.Context, cl *claim.Claim, lease time.Duration) error {
	c.calls.Add(1)
	return c.Claimer.Renew(ctx, cl, lease)
}

func (c counting) Release(ctx context.Context, cls []*claim.Claim, outcomes []claim.Status) []error {
	c.calls.Add(1)
	return c.Claimer.Release(ctx, cls, outcomes)
}

func (c counting) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	c.calls.Add(1)
	return c.Claimer.History(ctx, job, limit)
}

// Histories is one call however many jobs it reads, where the backend
// reads them in one (claim.Historian); job by job, it is as many.
func (c counting) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	inner := c.Claimer
	if b, ok := inner.(*claimers.Backend); ok {
		inner = b.Claimer // which forwards to claim.Histories in any case
	}
	if _, ok := inner.(claim.Historian); ok {
		c.calls.Add(1)
	} else {
		c.calls.Add(int64(len(qs)))
	}
	return claim.Histories(ctx, c.Claimer, qs)
}

// RunScale runs one scale scenario on the real runner.
func RunScale(ctx context.Context, s Services, o ScaleOptions) Scale {
	o.defaults()
	res := Scale{Claimer: o.Kind, Jobs: o.Jobs, Replicas: o.Replicas, Spread: "default"}
	if o.Spread != 0 {
		res.Spread = max(o.Spread, 0).String()
	}
	if len(o.ReplicaCmd) > 0 && o.Kind != config.ClaimerMemory { // a memory store lives in one process
		res.Processes = true
		return runScaleProcs(ctx, s, o, res)
	}
	fail := func(err error) Scale { res.Error = err.Error(); return res }
	n, err := s.isolate(ctx, o.Kind)
	if err != nil {
		return fail(err)
	}
	defer n.close()
	var calls atomic.Int64
	replicas := make([]claim.Claimer, o.Replicas)
	registers := make([]*control.Store, o.Replicas)
	for i := range replicas {
		b, err := n.open(ctx, fmt.Sprintf("r%d", i))
		if err != nil {
			return fail(err)
		}
		replicas[i] = counting{Claimer: b, calls: &calls}
		registers[i] = control.New(b.Controls, nil)
	}

	now := time.Now

	var (
		mu       sync.Mutex
		lags     []time.Duration
		starts   = make(map[string]int, o.Jobs)
		shares   = make([]int, o.Replicas)
		done     atomic.Int64
		settled  = make(chan struct{})
		finished atomic.Bool
	)
	check := func() {
		mu.Lock()
		n := len(lags)
		mu.Unlock()
		if n >= o.Jobs && done.Load() >= int64(o.Jobs*(o.Replicas-1)) && finished.CompareAndSwap(false, true) {
			close(settled)
		}
	}
	observe := func(i int) func(runner.Event) {
		return func(e runner.Event) {
			switch {
			case e.Kind == runner.EventStarted:
				lag := now().Sub(e.Run.At)
				mu.Lock()
				lags = append(lags, lag)
				starts[e.Run.ID()]++
				shares[i]++
				mu.Unlock()
				check()
			case e.Kind == runner.EventSkipped && e.Reason == runner.ReasonDone:
				done.Add(1)
				check()
			}
		}
	}

	// Two collections: the first may leave finalizer-held garbage.
	runtime.GC()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	runners := make([]*runner.Runner, o.Replicas)
	instant := time.Now().Add(o.Lead).Truncate(time.Second).Add(time.Second)
	for i := range runners {
		jobs, err := scaleJobs(o.Jobs, instant)
		if err != nil {
			return fail(err)
		}
		// The register as `scheduler run` has it: the replicas learn of
		// each other through it (see the runner's members.go).
		r, err := runner.New(runner.Options{Claimer: replicas[i], ClaimerName: o.Kind, Instance: fmt.Sprintf("r%d", i),
			Controls: registers[i], Lease: o.Lease, Spread: o.Spread, Now: now, Observe: observe(i)}, jobs)
		if err != nil {
			return fail(err)
		}
		runners[i] = r
	}

	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(func() { _ = r.Run(rctx) })
	}
	defer func() { cancel(); wg.Wait() }()

	// Idle: every replica is up and waiting for the instant.
	idle := time.NewTimer(o.Lead / 2)
	select {
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-idle.C:
	}
	runtime.GC()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	res.HeapPerJob = float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(o.Jobs*o.Replicas)
	cpu0 := cpuTime()
	calls.Store(0)

	timeout := time.NewTimer(o.Lead + o.Timeout)
	defer timeout.Stop()
	select {
	case <-settled:
	case <-timeout.C:
		res.Error = "timed out before every run started and every loser saw it done"
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	cpu := cpuTime() - cpu0
	res.CallsPerRun = float64(calls.Load()) / float64(o.Jobs)
	res.CPUPerRunus = float64(cpu) / float64(o.Jobs) / float64(time.Microsecond)

	mu.Lock()
	defer mu.Unlock()
	return finishScale(res, o.Jobs, starts, shares, lags)
}

// finishScale fills in what starts, shares and lags say.
func finishScale(res Scale, jobs int, starts map[string]int, shares []int, lags []time.Duration) Scale {
	for _, n := range starts {
		res.Duplicates += max(n-1, 0)
	}
	res.Missing = jobs - len(starts)
	res.LagP50ms = Percentile(lags, 0.5) / 1000
	res.LagP99ms = Percentile(lags, 0.99) / 1000
	if len(lags) > 0 {
		res.LagMaxms = float64(slices.Max(lags)) / float64(time.Millisecond)
	}
	res.Shares = slices.Clone(shares)
	if lo := slices.Min(shares); lo > 0 { // else 0: some replica ran nothing
		res.Fairness = float64(slices.Max(shares)) / float64(lo)
	}
	return res
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// claims says how the runner sent its claims: always in batches (claims
// and releases) now, by one process per replica or in this one.
func (s Scale) claims() string {
	if s.Processes {
		return "batched (+ releases), processes"
	}
	return "batched (+ releases), in-process"
}

// WriteScale prints scale results as a table.
func WriteScale(w io.Writer, rows []Scale) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scale\tjobs×replicas\tspread\tclaims\tlag p50\tlag p99\tall started\tcalls/run\tCPU/run\theap/job\tshares\tmax/min\tdup\tmissing\t")
	for _, s := range rows {
		if s.Error != "" && s.Shares == nil {
			fmt.Fprintf(tw, "%s\t%d×%d\t%s\t%s\terror: %s\t\t\t\t\t\t\t\t\t\t\n", s.Claimer, s.Jobs, s.Replicas, s.Spread, s.claims(), clip(s.Error, 80))
			continue
		}
		fair := fmt.Sprintf("%.2f", s.Fairness)
		if s.Fairness == 0 {
			fair = "∞"
		}
		fmt.Fprintf(tw, "%s\t%d×%d\t%s\t%s\t%.0fms\t%.0fms\t%.0fms\t%.2f\t%.0fµs\t%.0f B\t%v\t%s\t%d\t%d\t\n", s.Claimer, s.Jobs, s.Replicas, s.Spread, s.claims(),
			s.LagP50ms, s.LagP99ms, s.LagMaxms, s.CallsPerRun, s.CPUPerRunus, s.HeapPerJob, s.Shares, fair, s.Duplicates, s.Missing)
		if s.Error != "" {
			fmt.Fprintf(tw, "\t\t\t\terror: %s\t\t\t\t\t\t\t\t\t\t\n", clip(s.Error, 80))
		}
	}
	tw.Flush()
}

// scaleJobs are n jobs that do nothing, each due once, at instant.
func scaleJobs(n int, instant time.Time) ([]runner.Job, error) {
	jobs := make([]runner.Job, n)
	for j := range jobs {
		sched, err := schedule.Parse(instantSpec(instant), "UTC")
		if err != nil {
			return nil, err
		}
		jobs[j] = runner.Job{Name: fmt.Sprintf("scale.%05d", j), Schedule: sched, Grace: time.Second,
			Handler: func(context.Context, job.Run) error { return nil }}
	}
	return jobs, nil
}

// instantSpec is a schedule whose only instant (once a year) is at, on
// the real clock: every job falls due then, and the replicas need no
// shifted clock (a replica whose clock runs ahead of the backend's holds
// its runs until their instant comes on the backend's clock).
func instantSpec(at time.Time) string {
	at = at.UTC()
	return fmt.Sprintf("%d %d %d %d %d *", at.Second(), at.Minute(), at.Hour(), at.Day(), int(at.Month()))
}
