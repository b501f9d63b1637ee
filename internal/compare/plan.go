package compare

import (
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"time"
)

// plan is what the seed decides about a cell, drawn before it starts so
// that goroutines never share the generator. Offsets are from the cell's
// start. Every claimer gets the same plan for a scenario.
type plan struct {
	stagger  []time.Duration // replica start delays
	offsets  []time.Duration // replica clock skews
	latency  []time.Duration // per replica, each way (latency fault)
	resets   []resetAt
	victim   int // fallback victim when no run triggers a fault
	node     int // which redis-server a redis-restart hits
	skewAbs  time.Duration
	steady   [2]time.Duration // instants in this window must run exactly once
	faultAt  time.Duration
	fallback time.Duration // after faultAt
}

type resetAt struct {
	at      time.Duration
	replica int
}

// maxStagger bounds how far apart replicas start.
const maxStagger = 500 * time.Millisecond

// skewBound is the largest clock offset a scenario gives a replica.
func skewBound(f faultSet, maxSkew time.Duration) time.Duration {
	switch {
	case f.has(FaultSkew):
		return maxSkew / 2
	case f.has(FaultSkewBeyond):
		return 2 * maxSkew
	}
	return 0
}

// window computes the steady window of a cell: it opens once every replica
// is up (and a skewed clock has caught up), and closes a margin before the
// end so that runs near it could finish, or be taken over, before shutdown.
func window(o *Options, w *workload, skewAbs time.Duration) (from, to time.Duration) {
	from = maxStagger + skewAbs + time.Second
	return from, o.Duration - margin(o, w, skewAbs)
}

// margin is how long before its end a cell stops counting instants: the
// last ones must have time to finish, or be taken over.
func margin(o *Options, w *workload, skewAbs time.Duration) time.Duration {
	return w.longRun + 2*o.Lease + time.Second + skewAbs
}

// minSteady is the shortest steady window worth running: long enough for
// a triggered fault to find its run.
func minSteady(w *workload) time.Duration { return 2 * max(w.longPeriod, 2*time.Second) }

func newPlan(o *Options, scenario string, f faultSet, w *workload) plan {
	h := fnv.New64a()
	h.Write([]byte(scenario))
	rng := rand.New(rand.NewPCG(o.Seed, h.Sum64()))
	n, skew := o.Replicas, o.MaxClockSkew
	p := plan{stagger: make([]time.Duration, n), offsets: make([]time.Duration, n), latency: make([]time.Duration, n)}
	for i := range n {
		if i > 0 {
			p.stagger[i] = time.Duration(rng.Int64N(int64(maxStagger)))
		}
		switch {
		case f.has(FaultSkew):
			p.offsets[i] = time.Duration(rng.Int64N(int64(skew)+1)) - skew/2
		case f.has(FaultSkewBeyond):
			p.offsets[i] = skew + time.Duration(rng.Int64N(int64(skew)+1))
			if i%2 == 1 {
				p.offsets[i] = -p.offsets[i]
			}
		}
		p.latency[i] = time.Millisecond + time.Duration(rng.Int64N(int64(9*time.Millisecond)))
	}
	p.skewAbs = skewBound(f, skew)
	p.steady[0], p.steady[1] = window(o, w, p.skewAbs)
	p.faultAt = p.steady[0] + time.Duration(rng.Int64N(int64((p.steady[1]-p.steady[0])/4)+1))
	p.fallback = 2*max(w.longPeriod, 2*time.Second) + o.Lease
	for at := p.steady[0]; ; {
		at += o.Lease/4 + time.Duration(rng.Int64N(int64(o.Lease/4)+1))
		if at >= p.steady[1] {
			break
		}
		p.resets = append(p.resets, resetAt{at: at, replica: rng.IntN(n)})
	}
	p.victim, p.node = rng.IntN(n), rng.IntN(redlockNodes)
	return p
}

// skipped tells, before anything starts, whether a cell will be skipped.
func skipped(o *Options, kind, scenario string) bool {
	f := faultSet(strings.Split(scenario, "+"))
	return unsupported(o, kind, f) != "" || missing(o, kind, f) != ""
}
