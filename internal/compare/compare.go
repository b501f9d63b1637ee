// Package compare is the game-day harness behind `scheduler compare`: it
// runs claim strategies side by side under injected faults and reports what
// broke.
//
// Each (claimer, fault scenario) pair is a cell: a fresh namespace on the
// backend (a new PostgreSQL schema, a Redis key prefix, private
// redis-server nodes, a temporary SQLite file), N in-process replicas, each
// a runner.Runner with its own claimer client and its own clock, running the
// same generated workload: per-second ticks, long runs that outlive their
// lease, and billing-like runs making fenced writes to an in-memory fenced
// store. A wrapper around every replica's claimer applies the faults and
// records each call; the runners' Observe hook records each execution. From
// those the cell reports duplicate executions, missed runs, stale fenced
// writes rejected and accepted, claim and takeover latency, and claimer
// calls per run.
//
// Every choice the faults make (start staggers, clock offsets, when a fault
// strikes, which replica, latencies, resets) comes from --seed and the
// scenario's name, so every claimer meets the same plan and a rerun with the
// same seed meets it again. Which replica wins a given claim is the
// backend's business, so faults that must hit a holder (pause, crash,
// partition) strike the first replica found holding a suitable run once the
// fault's moment has come.
//
// Run owns every goroutine and process it starts: cells run concurrently,
// each stops its replicas, fault drivers, proxies and redis-server processes
// and drops its namespace before Run returns.
package compare

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Options configure a compare run. Validate reports bad usage.
type Options struct {
	Claimers []string // kinds, in report order
	Faults   []string // scenarios from ParseScenarios
	Replicas int      // per cell; at least 2
	Jobs     int      // workload size; at least 3
	Duration time.Duration
	Lease    time.Duration
	// MaxClockSkew is the bound replicas are configured with; skew stays
	// within it, skew-beyond exceeds it.
	MaxClockSkew time.Duration
	Seed         uint64
	// Parallel bounds how many cells run at once; 0 runs them all at once
	// (each sleeps on wall time, so running them in turn multiplies the time).
	Parallel int

	PostgresDSN  string   // "": postgres cells are skipped
	RedisAddr    string   // "": compare starts its own redis-server per cell
	RedlockAddrs []string // empty: compare starts 3 redis-server nodes per cell
	RedisServer  string   // redis-server binary; "": looked up on PATH
	// EtcdEndpoints are a cluster's members; empty: compare starts a
	// private 3-member cluster per cell.
	EtcdEndpoints []string
	// PostgresBin is the directory of initdb and postgres, for the private
	// cluster a postgres-restart cell crashes; "": initdb on PATH, else
	// pg_config --bindir.
	PostgresBin string
	// TempDir is where cells keep their files: SQLite databases and the
	// private PostgreSQL cluster; "": the system's temp directory. SQLite
	// syncs every commit, so its numbers are the disk's under this
	// directory.
	TempDir string
	// Progress, when set, receives a progress line while cells run; TTY
	// rewrites it in place.
	Progress io.Writer
	TTY      bool
}

// Validate reports every usage problem at once.
func (o *Options) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(o.Claimers) == 0 {
		bad("--claimers: none given")
	}
	for i, k := range o.Claimers {
		if !slices.Contains(Kinds, k) && k != KindBroken {
			bad("--claimers: unknown claimer %q (want some of %s)", k, strings.Join(Kinds, ","))
		} else if slices.Index(o.Claimers, k) != i {
			bad("--claimers: %q listed twice", k)
		}
	}
	if len(o.Faults) == 0 {
		bad("--faults: none given")
	}
	if o.Replicas < 2 {
		bad("--replicas %d: want at least 2 (faults need a replica to take over)", o.Replicas)
	}
	if o.Jobs < 3 {
		bad("--jobs %d: want at least 3 (one tick, one long, one billing)", o.Jobs)
	}
	if o.Lease < 300*time.Millisecond {
		bad("--lease %v: want at least 300ms", o.Lease)
	}
	if o.MaxClockSkew <= 0 {
		bad("--max-clock-skew %v: must be positive", o.MaxClockSkew)
	}
	if o.Parallel < 0 {
		bad("--parallel %d: must not be negative", o.Parallel)
	}
	if need := o.MinDuration(); o.Lease > 0 && o.Jobs >= 3 && o.Duration < need {
		bad("--duration %v: too short for --lease %v and these faults; want at least %v", o.Duration, o.Lease, need)
	}
	if o.TempDir != "" {
		if fi, err := os.Stat(o.TempDir); err != nil {
			bad("--temp-dir %s: %v", o.TempDir, errors.Unwrap(err))
		} else if !fi.IsDir() {
			bad("--temp-dir %s: not a directory", o.TempDir)
		}
	}
	return errors.Join(errs...)
}

// MinDuration is the shortest cell that leaves a useful steady window for
// the requested scenarios.
func (o *Options) MinDuration() time.Duration {
	w, err := newWorkload(max(o.Jobs, 3), o.Lease)
	if err != nil {
		return 0
	}
	var worst time.Duration
	for _, sc := range o.Faults {
		worst = max(worst, skewBound(faultSet(strings.Split(sc, "+")), o.MaxClockSkew))
	}
	from, to := window(&Options{Lease: o.Lease}, w, worst)
	return (from - to) + minSteady(w)
}

// Run runs every cell and returns the report. The error is for invalid
// options only; a cell that cannot run is reported as such. Cancelling ctx
// ends the cells early; the report then covers what ran.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	w, _ := newWorkload(o.Jobs, o.Lease)
	r := &Report{Schema: Schema, StartedAt: time.Now().UTC(), Seed: o.Seed, Settings: Settings{
		Claimers: o.Claimers, Faults: o.Faults, Replicas: o.Replicas, Jobs: o.Jobs, Workload: w.counts,
		DurationMS: ms(o.Duration), LeaseMS: ms(o.Lease), RenewEveryMS: ms(o.Lease / 3), MaxClockSkewMS: ms(o.MaxClockSkew),
	}}
	type job struct{ kind, scenario string }
	var jobs []job
	for _, k := range o.Claimers {
		for _, sc := range o.Faults {
			jobs = append(jobs, job{k, sc})
		}
	}
	r.Cells = make([]*Cell, len(jobs))
	parallel := cmp.Or(o.Parallel, len(jobs))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	prog := newProgress(o, len(jobs))
	runnable := 0
	for _, j := range jobs {
		if !skipped(&o, j.kind, j.scenario) {
			runnable++
		}
	}
	prog.printf("compare: %d cells (%d claimers × %d scenarios), %d to run, %d at a time: about %v\n",
		len(jobs), len(o.Claimers), len(o.Faults), runnable, parallel,
		time.Duration((runnable+parallel-1)/parallel)*o.Duration)
	for i, j := range jobs {
		wg.Go(func() {
			if skipped(&o, j.kind, j.scenario) {
				r.Cells[i] = runCell(ctx, &o, j.kind, j.scenario) // returns at once
				prog.skip()
				return
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				r.Cells[i] = &Cell{Claimer: j.kind, Fault: j.scenario, Status: StatusError, Reason: "interrupted before the cell started"}
				return
			}
			defer func() { <-sem }()
			prog.started()
			r.Cells[i] = runCell(ctx, &o, j.kind, j.scenario)
			prog.done()
		})
	}
	prog.wait(&wg)
	r.FinishedAt = time.Now().UTC()
	r.summarize()
	return r, nil
}

// progress prints "compare: 3/10 cells done, 4 running, 12s elapsed" while
// cells run: in place on a terminal, every 10s otherwise.
type progress struct {
	w              io.Writer
	tty            bool
	total          int
	start          time.Time
	mu             sync.Mutex
	running, doneN int
	estimate       time.Duration
}

func newProgress(o Options, total int) *progress {
	return &progress{w: o.Progress, tty: o.TTY, total: total, start: time.Now(), estimate: o.Duration}
}

func (p *progress) started() { p.mu.Lock(); p.running++; p.mu.Unlock() }
func (p *progress) done()    { p.mu.Lock(); p.running--; p.doneN++; p.mu.Unlock() }
func (p *progress) skip()    { p.mu.Lock(); p.doneN++; p.mu.Unlock() }

// wait waits for wg, printing progress meanwhile.
func (p *progress) wait(wg *sync.WaitGroup) {
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	every := 10 * time.Second
	if p.tty {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-finished:
			if p.w != nil && p.tty {
				fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", 79))
			}
			return
		case <-t.C:
			p.print()
		}
	}
}

func (p *progress) printf(format string, a ...any) {
	if p.w != nil {
		fmt.Fprintf(p.w, format, a...)
	}
}

func (p *progress) print() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	line := fmt.Sprintf("compare: %d/%d cells done, %d running, %v elapsed (each cell runs %v)",
		p.doneN, p.total, p.running, time.Since(p.start).Round(time.Second), p.estimate)
	p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r%-79s", line)
		return
	}
	fmt.Fprintln(p.w, line)
}
