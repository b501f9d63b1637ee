package claimtest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Throughput runs op serially and from parallel goroutines, reporting
// unit/s for each: the shape of every claimer benchmark and of the raw
// reference it is compared with. op gets a unique sequence number.
func Throughput(b *testing.B, unit string, op func(b *testing.B, i int64)) {
	var seq atomic.Int64
	b.Run("Serial", func(b *testing.B) {
		start := time.Now()
		for b.Loop() {
			op(b, seq.Add(1))
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), unit+"/s")
	})
	b.Run("Parallel", func(b *testing.B) {
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				op(b, seq.Add(1))
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), unit+"/s")
	})
}

// BenchClaimRelease claims a fresh run and releases it as succeeded: a
// claimer's cost per executed run.
func BenchClaimRelease(b *testing.B, c claim.Claimer) {
	Throughput(b, "claims", func(b *testing.B, i int64) {
		cl, err := claim.ClaimOne(b.Context(), c, RunAt("job.bench", i), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := claim.ReleaseOne(b.Context(), c, cl, claim.Succeeded); err != nil {
			b.Fatal(err)
		}
	})
}

// RunAt is the i-th run of job on the suite's fixed timeline.
func RunAt(job string, i int64) claim.Run {
	return claim.Run{Job: job, At: base.Add(time.Duration(i) * time.Second)}
}
