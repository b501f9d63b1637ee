package schedule

import (
	"hash/fnv"
	"time"
)

// Jittered is when the instant at of job starts under a jitter of at most
// jitter: at plus an offset hashed from (job, at), uniform in [0, jitter)
// and in [0, the gap to the next instant), so a run never starts at or
// after its successor's instant. Every replica computes the same offset
// without talking to the others, and the run keeps at as its instant (its
// run id), so jitter changes when a run starts, never which run it is.
// Jitter spreads jobs that share a spec (every job "@hourly") over the
// window instead of waking every downstream at once.
func (s *Schedule) Jittered(job string, at time.Time, jitter time.Duration) time.Time {
	if jitter <= 0 {
		return at
	}
	window := jitter
	if gap := s.Next(at).Sub(at); gap > 0 && gap < window {
		window = gap
	}
	h := fnv.New64a()
	h.Write([]byte(job))
	h.Write([]byte{0})
	h.Write([]byte(at.UTC().Format(time.RFC3339Nano)))
	// FNV's last bytes barely reach the high bits: mix them (splitmix64's
	// finalizer) before taking the fraction.
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	off := time.Duration(float64(x>>11) / (1 << 53) * float64(window))
	return at.Add(off.Truncate(time.Millisecond))
}
