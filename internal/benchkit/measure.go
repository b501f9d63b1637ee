// Package benchkit measures the claimers against the raw clients they are
// built on, and the runner at scale: 10,000 jobs due at one instant on
// several replicas. cmd/scheduler-bench drives it; bench/run.sh adds the
// peer libraries (measured in the nested module bench/, so that they never
// become dependencies of the scheduler) and prints one table.
package benchkit

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Row is one measured line of the table: ops/s and latency of one operation
// at one concurrency. The nested bench module writes the same JSON.
type Row struct {
	Name  string `json:"name"`
	Group string `json:"group"` // claimer, raw, peer
	// Op says what one operation is ("claim+release", "SET NX PX").
	Op          string  `json:"op"`
	Concurrency int     `json:"concurrency"`
	Ops         int64   `json:"ops"`
	Seconds     float64 `json:"seconds"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	// RoundTrips is how many sequential round trips to the backend one
	// operation makes on its critical path; ratios to a reference that makes
	// a different number are taken per round trip.
	RoundTrips int `json:"round_trips"`
	// Ref names the row this one is compared with (same concurrency).
	Ref string `json:"ref,omitempty"`
	// Ratio is this row's throughput per round trip over Ref's, filled in
	// by Finish.
	Ratio float64 `json:"ratio,omitempty"`
	Error string  `json:"error,omitempty"`
	// Unavailable counts operations that failed with claim.ErrUnavailable
	// (a node timeout under load): reported, not fatal, not in the rates.
	Unavailable int64  `json:"unavailable,omitempty"`
	Note        string `json:"note,omitempty"`
	// PerOp is how many runs one operation claims and releases, on a
	// batch row; Ops and OpsPerSec then count runs, p50/p99 batches.
	PerOp int `json:"per_op,omitempty"`
	// CPUus is this process's CPU time (user and system, every goroutine
	// and the garbage collector) per operation (per run on a batch row)
	// while the row was measured: the client's cost, beside the server's
	// and the round trips. Zero for the raw tools measured as processes
	// of their own (redis-benchmark, pgbench).
	CPUus float64 `json:"cpu_us,omitempty"`
}

// Op is one operation under measurement; i numbers operations from 0, so
// each call can name a fresh run or key.
type Op func(ctx context.Context, i int64) error

// Measure runs op from conc goroutines for d after a warm-up of d/10 and
// reports throughput and latency percentiles. The first error stops the
// measurement and is recorded in the row.
func Measure(ctx context.Context, row Row, conc int, d time.Duration, op Op) Row {
	return Interleave(ctx, conc, d, 1, []Row{row}, []Op{op})[0]
}

// Interleave measures several operations that are to be compared in turns:
// rounds times, each op for d/rounds, after one warm-up of each. On a
// shared, noisy machine, load that comes and goes then weighs on every row
// alike, and their ratios stay meaningful.
func Interleave(ctx context.Context, conc int, d time.Duration, rounds int, rows []Row, ops []Op) []Row {
	ms := make([]*meter, len(ops))
	for i, op := range ops {
		ms[i] = &meter{op: op, conc: conc}
		ms[i].run(ctx, d/10, false)
	}
	for range rounds {
		for _, m := range ms {
			if m.err == nil {
				m.run(ctx, d/time.Duration(rounds), true)
			}
		}
	}
	out := make([]Row, len(rows))
	for i, row := range rows {
		m := ms[i]
		row.Concurrency = conc
		if m.err != nil {
			row.Error = m.err.Error()
		} else {
			row.Ops, row.Seconds = int64(len(m.lat)), m.took.Seconds()
			row.OpsPerSec = float64(len(m.lat)) / m.took.Seconds()
			row.P50us, row.P99us = Percentile(m.lat, 0.50), Percentile(m.lat, 0.99)
			if len(m.lat) > 0 {
				row.CPUus = float64(m.cpu) / float64(len(m.lat)) / float64(time.Microsecond)
			}
		}
		row.Unavailable = m.unavailable.Load()
		out[i] = row
	}
	return out
}

// meter accumulates one operation's latencies over several spans.
type meter struct {
	op   Op
	conc int
	seq  atomic.Int64
	lat  []time.Duration
	took time.Duration
	cpu  time.Duration // the process's CPU time over the kept spans
	err  error
	// unavailable counts claim.ErrUnavailable failures, which do not stop
	// the measurement.
	unavailable atomic.Int64
}

// run runs m.op from m.conc goroutines for d; keep adds the span to the
// results.
func (m *meter) run(ctx context.Context, d time.Duration, keep bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start, cpu0 := time.Now(), cpuTime()
	end := start.Add(d)
	for range m.conc {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1024)
			for time.Now().Before(end) && ctx.Err() == nil {
				t := time.Now()
				err := m.op(ctx, m.seq.Add(1)-1)
				if errors.Is(err, claim.ErrUnavailable) && ctx.Err() == nil {
					m.unavailable.Add(1)
					continue
				}
				if err != nil {
					mu.Lock()
					if m.err == nil && !errors.Is(err, context.Canceled) {
						m.err = err
					}
					mu.Unlock()
					cancel()
					break
				}
				lat = append(lat, time.Since(t))
			}
			if keep {
				mu.Lock()
				m.lat = append(m.lat, lat...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if keep {
		m.took += time.Since(start)
		m.cpu += cpuTime() - cpu0
	}
}

// Percentile returns the q-quantile of lat in microseconds (nearest rank).
// It sorts lat.
func Percentile(lat []time.Duration, q float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	i := int(q*float64(len(lat))+0.5) - 1
	i = min(max(i, 0), len(lat)-1)
	return float64(lat[i]) / float64(time.Microsecond)
}
