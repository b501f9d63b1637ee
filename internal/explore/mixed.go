package explore

// This file draws and applies mixed configs: a rolling deploy caught
// halfway, where some replicas run a second version of one job's schedule
// (another spec, or the same spec in another time zone). The history is
// then held to the rule for mixed configs (docs/operations.md): every
// instant either version names while a replica of that version could
// claim it runs (history.Lost), once, under its one run id (the per-run
// invariants: succeeded-twice, run-overlap, released-twice), and no run
// starts at an instant neither names (history.Unscheduled).

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/schedule"
)

// Mixed is a second version of one job's schedule, run by some replicas.
type Mixed struct {
	Job      string
	Spec, TZ string // the second version
	// Replicas run it (indexes, from 0); the others run the workload's.
	Replicas []int
}

func (m *Mixed) String() string {
	var on []string
	for _, i := range m.Replicas {
		on = append(on, fmt.Sprintf("r%d", i+1))
	}
	return fmt.Sprintf("mixed config: %s runs %q (zone %s) on %s", m.Job, m.Spec, m.TZ, strings.Join(on, ", "))
}

// variants are the second versions' specs, by job: each names instants
// the first does not, and some it does, so both kinds are explored.
var variants = map[string]string{
	"tick":     "*/3 * * * * *",
	"long":     "*/6 * * * * *",
	"stubborn": "*/2 * * * * *",
	"sparse":   "*/10 * * * * *",
}

// variantZone is the other zone of a zone change: 5:45 from UTC, so a
// wall-clock spec would fire at other instants. Seconds-level specs and
// @every fire at the same ones: the change is then one of fingerprint
// only, and the two versions contend for every instant.
const variantZone = "Asia/Kathmandu"

// drawMixed draws a seed's mixed config, or nil, from a stream of its
// own, so a seed's plan and operator stay what they were without it: on
// half the seeds with two replicas or more, a job with a variant runs it
// (a third of the time, its own spec in another zone) on some replicas,
// never all.
func drawMixed(seed uint64, jobs []jobDef, replicas int) *Mixed {
	rng := rand.New(rand.NewPCG(seed, 0x3d))
	var js []jobDef
	for _, j := range jobs {
		if variants[j.name] != "" {
			js = append(js, j)
		}
	}
	if replicas < 2 || len(js) == 0 || rng.IntN(2) == 0 {
		return nil
	}
	j := js[rng.IntN(len(js))]
	m := &Mixed{Job: j.name, Spec: variants[j.name], TZ: "UTC"}
	if rng.IntN(3) == 0 {
		m.Spec, m.TZ = j.spec, variantZone
	}
	m.Replicas = rng.Perm(replicas)[:1+rng.IntN(replicas-1)]
	slices.Sort(m.Replicas)
	return m
}

// setupMixed settles the exploration's mixed config: cfg.Mixed, or the
// seed's draw unless a plan is pinned (it replays the history it pinned).
func (w *world) setupMixed() error {
	m := w.cfg.Mixed
	if m == nil && w.cfg.Plan == nil {
		m = drawMixed(w.cfg.Seed, w.jobs, w.cfg.Replicas)
	}
	if m == nil || m.Job == "" {
		return nil
	}
	s, err := schedule.Parse(m.Spec, m.TZ)
	if err != nil {
		return fmt.Errorf("%s: %w", m, err)
	}
	w.mixed, w.mixedSched = m, s
	return nil
}

// scheduleOf is the version of job i's schedule replica r runs.
func (w *world) scheduleOf(r *replica, i int) *schedule.Schedule {
	if w.runsMixed(r, w.jobs[i].name) {
		return w.mixedSched
	}
	return w.scheds[i]
}

func (w *world) runsMixed(r *replica, job string) bool {
	return w.mixed != nil && w.mixed.Job == job && slices.Contains(w.mixed.Replicas, r.idx)
}

// due is an instant of a job and the replicas whose version names it:
// only they dispatch it, and stand by for it.
type due struct {
	at   time.Time
	reps []*replica
}

// dueInstants lists the instants of job i in (from, to) that some
// replica's version names, in order.
func (w *world) dueInstants(i int, from, to time.Time) []due {
	var out []due
	at := from
	for {
		next := time.Time{}
		for _, r := range w.reps {
			if n := w.scheduleOf(r, i).Next(at); !n.IsZero() && (next.IsZero() || n.Before(next)) {
				next = n
			}
		}
		if next.IsZero() || !next.Before(to) {
			return out
		}
		d := due{at: next}
		for _, r := range w.reps {
			if names(w.scheduleOf(r, i), next) {
				d.reps = append(d.reps, r)
			}
		}
		out = append(out, d)
		at = next
	}
}

// scheduled reports whether a version some replica runs names run's
// instant (history.Spec.Scheduled).
func (w *world) scheduled(run claim.Run) bool {
	for i, j := range w.jobs {
		if j.name != run.Job {
			continue
		}
		return names(w.scheds[i], run.At) || (w.mixed != nil && w.mixed.Job == j.name && names(w.mixedSched, run.At))
	}
	return false
}

// names reports whether s fires at at (instants are whole seconds).
func names(s *schedule.Schedule, at time.Time) bool {
	return s.Next(at.Add(-time.Second)).Equal(at)
}
