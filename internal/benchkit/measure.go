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
	Note  string  `json:"note,omitempty"`
}

// Op is one operation under measurement; i numbers operations from 0, so
// each call can name a fresh run or key.
type Op func(ctx context.Context, i int64) error

// Measure runs op from conc goroutines for d after a warm-up of d/10 and
// reports throughput and latency percentiles. The first error stops the
// measurement and is recorded in the row.
func Measure(ctx context.Context, row Row, conc int, d time.Duration, op Op) Row {
	row.Concurrency = conc
	var seq atomic.Int64
	run := func(d time.Duration, keep bool) ([]time.Duration, time.Duration, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var (
			mu      sync.Mutex
			all     []time.Duration
			firstEr error
			wg      sync.WaitGroup
		)
		start := time.Now()
		end := start.Add(d)
		for range conc {
			wg.Go(func() {
				lat := make([]time.Duration, 0, 1024)
				for time.Now().Before(end) && ctx.Err() == nil {
					t := time.Now()
					if err := op(ctx, seq.Add(1)-1); err != nil {
						mu.Lock()
						if firstEr == nil && !errors.Is(err, context.Canceled) {
							firstEr = err
						}
						mu.Unlock()
						cancel()
						break
					}
					lat = append(lat, time.Since(t))
				}
				if keep {
					mu.Lock()
					all = append(all, lat...)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return all, time.Since(start), firstEr
	}
	if _, _, err := run(d/10, false); err != nil {
		row.Error = err.Error()
		return row
	}
	lat, took, err := run(d, true)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	row.Ops, row.Seconds = int64(len(lat)), took.Seconds()
	row.OpsPerSec = float64(len(lat)) / took.Seconds()
	row.P50us, row.P99us = Percentile(lat, 0.50), Percentile(lat, 0.99)
	return row
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
