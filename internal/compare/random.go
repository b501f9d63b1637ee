package compare

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/explore"
	"github.com/scheduler-dev/scheduler/internal/history"
)

// FaultRandom is the scenario `--faults random`: the fault explorer's
// nemesis (internal/nemesis) composes seeded faults of at least five
// classes over the cell, on the explorer's replicas and workload, and the
// history checker (internal/history) judges what every replica did. It is
// the same engine CI runs (internal/explore). The plan follows from the
// seed and from every setting that shapes it (replicas, lease, skew,
// duration, and whether compare started the servers, which adds their
// restarts): the replay command a cell prints carries them all.
const FaultRandom = "random"

// duplicateInvariants and missedInvariants map the checker's violations
// onto the report's columns.
var (
	duplicateInvariants = []string{history.SucceededTwice, history.GrantOverlap, history.RunOverlap,
		history.ReleasedTwice, history.JobOverlap, history.HandedBackDone}
	missedInvariants = []string{history.Lost, history.Abandoned, history.TakeoverMisfire}
)

// runRandom runs kind under the nemesis drawn from o.Seed.
func runRandom(ctx context.Context, o *Options, kind string) *Cell {
	res := &Cell{Claimer: kind, Fault: FaultRandom}
	ns, err := openNamespace(ctx, o, kind, faultSet{FaultRandom})
	if err != nil {
		return res.unopened(err)
	}
	defer ns.closeInto(res)
	cfg := explore.Config{Context: ctx, Seed: o.Seed, Replicas: o.Replicas, Lease: o.Lease, MaxSkew: o.MaxClockSkew,
		Faults: max(o.Duration/2, 2*o.Lease), Extra: 2,
		Open: func(id string) (claim.Claimer, error) { return ns.open(ctx, id, nil) }}
	if ns.ns != nil {
		// The operator's pauses and requests go straight to the backend,
		// as the CLI's do, past the faults the replicas suffer.
		op, err := ns.ns.Open(ctx, "operator")
		if err != nil {
			return res.unopened(err)
		}
		defer op.Close()
		cfg.Controls = op.Controls
	}
	if len(ns.servers) > 0 {
		// A crashed PostgreSQL replays its WAL: its restarts lose nothing
		// acknowledged, and excuse no run done again after its release.
		cfg.Durable = kind == KindPostgres
		cfg.Nodes = len(ns.servers)
		cfg.Restart = func(node int, down time.Duration) error {
			s := ns.servers[node]
			s.Crash()
			time.Sleep(down) // the server stays down for the plan's time
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 40*time.Second)
			defer cancel()
			return s.Start(sctx)
		}
	}
	start := time.Now()
	r, err := explore.Run(cfg)
	if err != nil {
		res.Status, res.Reason = StatusError, err.Error()
		if ctx.Err() != nil {
			res.Reason = "interrupted before the cell ended"
		}
		return res
	}
	res.DurationMS = ms(time.Since(start))
	res.RunsExpected = r.Expected
	for _, e := range r.Events {
		if e.Kind == history.Start {
			res.Executions++
			if e.Attempt > 1 {
				res.Takeovers++
			}
		}
		if e.Kind == history.End && e.Status == claim.LeaseLost {
			res.LeaseLost++
		}
	}
	for _, op := range r.Plan.Ops {
		who := ""
		if op.Replica >= 0 {
			who = fmt.Sprintf("r%d", op.Replica+1)
		}
		res.FaultEvents = append(res.FaultEvents, FaultEvent{Kind: op.Kind, Replica: who, AtMS: ms(op.At),
			DurationMS: ms(op.For), Note: op.String()})
	}
	res.Notes = append(res.Notes, fmt.Sprintf("nemesis %s (%d classes: %v); %d replicas", r.Plan, len(r.Plan.Classes()),
		r.Plan.Classes(), r.Replicas), "replay: "+replayCommand(o, kind))
	// Run ids listed once each, at most maxListed, as scripted cells list
	// them.
	list := func(ids []string, id string) []string {
		if len(ids) < maxListed && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
		return ids
	}
	for _, v := range r.Violations {
		switch {
		case slices.Contains(duplicateInvariants, v.Invariant):
			res.DuplicateExecutions++
			res.DuplicateRuns = list(res.DuplicateRuns, v.Run)
		case slices.Contains(missedInvariants, v.Invariant):
			res.MissedRuns++
			res.MissedRunIDs = list(res.MissedRunIDs, v.Run)
		}
		res.Violations = append(res.Violations, v.Format(r.T0))
	}
	// Expected less missed, so that a reader of the JSON who subtracts
	// finds the lost runs, not every run.
	res.RunsExecuted = max(res.RunsExpected-res.MissedRuns, 0)
	res.Status = StatusOK
	if len(r.Violations) > 0 {
		res.Status = StatusFailed
	}
	return res
}

// replayCommand is the command that draws kind's plan again: the seed and
// every flag the plan depends on, the servers' included (whether compare
// starts its own decides whether restarts are drawn). A DSN is written as
// $POSTGRES_DSN: it may hold a password.
func replayCommand(o *Options, kind string) string {
	cmd := fmt.Sprintf("scheduler compare --claimers %s --faults random --seed %d --replicas %d --lease %s --max-clock-skew %s --duration %s",
		kind, o.Seed, o.Replicas, o.Lease, o.MaxClockSkew, o.Duration)
	switch {
	case kind == "postgres" && o.PostgresDSN != "":
		cmd += ` --postgres-dsn "$POSTGRES_DSN"`
	case kind == "redis" && o.RedisAddr != "":
		cmd += " --redis-addr " + o.RedisAddr
	case kind == "redlock" && len(o.RedlockAddrs) > 0:
		cmd += " --redlock-addrs " + strings.Join(o.RedlockAddrs, ",")
	case kind == "etcd" && len(o.EtcdEndpoints) > 0:
		cmd += " --etcd-endpoints " + strings.Join(o.EtcdEndpoints, ",")
	}
	return cmd
}
