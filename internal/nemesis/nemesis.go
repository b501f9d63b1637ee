// Package nemesis draws seeded fault schedules: which faults hit which
// replica, when, and for how long. The in-process explorer
// (internal/explore) and `scheduler compare --faults random` apply the same
// plans, each with its own means (a faulty claimer wrapper in a synctest
// bubble; proxies, frozen replicas and restarted servers against a real
// backend), and judge the result with internal/history.
package nemesis

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Fault classes. Each Op is one of them.
const (
	Crash     = "crash"     // the replica dies (no release, no renewal) and restarts after For
	Term      = "term"      // SIGTERM: graceful stop, restart after For
	Pause     = "pause"     // the replica freezes (handlers, clock, calls) for For, as a GC or SIGSTOP
	Partition = "partition" // the replica's requests and replies are lost for For
	OneWay    = "oneway"    // requests reach the backend, replies are lost, for For
	Outage    = "outage"    // the backend is unreachable from every replica for For
	Latency   = "latency"   // every call of the replica takes Delay longer each way, for For
	Clock     = "clock"     // the replica's wall clock jumps by Shift (beyond max skew) for For
	Restart   = "restart"   // the backend (or one node: Node) restarts, losing what it must
	Stall     = "stall"     // the backend stops (SIGSTOP, a GC) for For: requests wait, then land, answered or not
	Refuse    = "refuse"    // the backend answers but refuses every write for For (a full disk, read-only)
	Rewind    = "rewind"    // the backend's data goes back For in time, its process unchanged (made a replica of an old copy)
)

// Classes lists every fault class, in a fixed order. Refuse and Rewind are
// not among them: only a real backend can refuse writes or go back in
// time, and a harness that can make it names the class (drawing it among
// the others would change every pinned seed's plan).
var Classes = []string{Crash, Term, Pause, Partition, OneWay, Outage, Latency, Clock, Restart, Stall}

// Op is one fault. Times are offsets from the start of the history.
type Op struct {
	Kind    string
	Replica int // -1: every replica (outage, restart)
	At, For time.Duration
	Delay   time.Duration // latency
	Shift   time.Duration // clock
	Node    int           // restart: which server, when there are several
}

// End is when the fault is over.
func (o Op) End() time.Duration { return o.At + o.For }

func (o Op) String() string {
	who := "all"
	if o.Replica >= 0 {
		who = fmt.Sprintf("r%d", o.Replica+1)
	}
	s := fmt.Sprintf("%s %s @%.2fs for %.2fs", o.Kind, who, o.At.Seconds(), o.For.Seconds())
	switch o.Kind {
	case Latency:
		s += fmt.Sprintf(" +%v", o.Delay)
	case Clock:
		s += fmt.Sprintf(" %+.2fs", o.Shift.Seconds())
	case Restart:
		s += fmt.Sprintf(" node %d", o.Node)
	}
	return s
}

// Params shape a plan.
type Params struct {
	Replicas int
	Lease    time.Duration
	MaxSkew  time.Duration
	// Window is where faults start: [From, To).
	From, To time.Duration
	// Classes the plan may draw from (default: Classes without Restart).
	Classes []string
	// Distinct is how many faults of different classes the plan composes
	// at least (default 5, at most len(Classes)); Extra more are drawn from
	// any class.
	Distinct, Extra int
	// Nodes is how many backend servers a Restart may hit (default 1).
	Nodes int
}

// Plan is a seeded fault schedule.
type Plan struct {
	Seed uint64
	Ops  []Op
}

// Heal is when the last fault is over.
func (p Plan) Heal() time.Duration {
	var end time.Duration
	for _, o := range p.Ops {
		end = max(end, o.End())
	}
	return end
}

// Classes reports the distinct fault classes the plan composes.
func (p Plan) Classes() []string {
	var out []string
	for _, o := range p.Ops {
		if !slices.Contains(out, o.Kind) {
			out = append(out, o.Kind)
		}
	}
	return out
}

func (p Plan) String() string {
	parts := make([]string, len(p.Ops))
	for i, o := range p.Ops {
		parts[i] = o.String()
	}
	return fmt.Sprintf("seed %d: %s", p.Seed, strings.Join(parts, "; "))
}

// New draws a plan from seed. The same seed and params give the same plan.
func New(seed uint64, p Params) Plan {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	classes := p.Classes
	if len(classes) == 0 {
		classes = slices.DeleteFunc(slices.Clone(Classes), func(c string) bool { return c == Restart })
	}
	distinct := min(max(p.Distinct, 5), len(classes))
	if p.Distinct > 0 {
		distinct = min(p.Distinct, len(classes))
	}
	kinds := slices.Clone(classes)
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	kinds = kinds[:distinct]
	for range p.Extra {
		kinds = append(kinds, classes[rng.IntN(len(classes))])
	}
	plan := Plan{Seed: seed}
	span := max(p.To-p.From, time.Millisecond)
	for _, k := range kinds {
		op := Op{Kind: k, Replica: rng.IntN(max(p.Replicas, 1)), At: p.From + time.Duration(rng.Int64N(int64(span)))}
		lease := p.Lease
		switch k {
		case Crash, Term:
			op.For = lease/2 + time.Duration(rng.Int64N(int64(3*lease)))
		case Pause:
			// Shorter than a lease (a GC) or well past it (SIGSTOP).
			op.For = lease/4 + time.Duration(rng.Int64N(int64(5*lease/2)))
		case Partition, OneWay:
			op.For = lease/4 + time.Duration(rng.Int64N(int64(2*lease)))
		case Outage:
			// Several leases: what a handler that returns meanwhile meets.
			op.Replica = -1
			op.For = lease/2 + time.Duration(rng.Int64N(int64(3*lease)))
		case Stall:
			// Past a claim's timeout, up to two leases.
			op.Replica = -1
			op.For = lease/4 + time.Duration(rng.Int64N(int64(7*lease/4)))
		case Refuse:
			// Past a lease, so that leases lapse while their holders
			// cannot release, and past the hold's chronic cap (three
			// leases) at times.
			op.Replica = -1
			op.For = lease + time.Duration(rng.Int64N(int64(4*lease)))
		case Rewind:
			// A copy taken up to three leases before: runs finished,
			// granted and taken over since are gone from the data.
			op.Replica = -1
			op.For = lease/2 + time.Duration(rng.Int64N(int64(5*lease/2)))
		case Latency:
			op.For = lease + time.Duration(rng.Int64N(int64(2*lease)))
			op.Delay = time.Millisecond + time.Duration(rng.Int64N(int64(lease/4)))
		case Clock:
			op.For = lease + time.Duration(rng.Int64N(int64(4*lease)))
			op.Shift = p.MaxSkew + time.Millisecond + time.Duration(rng.Int64N(int64(3*p.MaxSkew)))
			if rng.IntN(2) == 0 {
				op.Shift = -op.Shift
			}
		case Restart:
			op.Replica = -1
			op.Node = rng.IntN(max(p.Nodes, 1))
			op.For = time.Duration(rng.Int64N(int64(lease)))
		}
		plan.Ops = append(plan.Ops, op)
	}
	slices.SortStableFunc(plan.Ops, func(a, b Op) int { return int(a.At - b.At) })
	return plan
}
