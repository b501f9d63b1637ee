package cli

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/compare"
)

// compare runs `scheduler compare`: flags → compare.Run → table, JSON, HTML.
// Exit 0 when no cell shows a duplicate, a missed run or a stale write
// accepted; 1 when one does (or could not run); 2 on bad usage.
func (e *env) compare(args []string) int {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: scheduler compare [flags]\n\n"+
			"Runs claim strategies side by side, as in-process replicas under injected faults,\n"+
			"and reports duplicates, missed runs, stale writes and latencies (docs/compare.md).\n\n"+
			"Faults: %s; join with + to combine in one cell (pause+skew).\n"+
			"random: the fault explorer's nemesis, at least five fault classes composed over\n"+
			"time from --seed, judged by its history checker (the engine CI runs).\n\nFlags:\n",
			strings.Join(compare.AllFaults, ", "))
		fs.PrintDefaults()
		e.printExamples(fs.Output(), "compare")
	}
	claimers := fs.String("claimers", strings.Join(compare.Kinds, ","), "claimer `KINDS` to compare, comma-separated")
	faults := fs.String("faults", "none,pause,crash,skew,partition", "fault `SCENARIOS`, comma-separated")
	replicas := fs.Int("replicas", 3, "replicas per cell")
	jobs := fs.Int("jobs", 20, "jobs in the workload (a fifth long, a fifth billing-like, the rest per-second)")
	duration := fs.Duration("duration", 60*time.Second, "how long each cell runs")
	lease := fs.Duration("lease", 3*time.Second, "claim lease (renewed every lease/3)")
	skew := fs.Duration("max-clock-skew", time.Second, "max_clock_skew the replicas are configured with")
	seed := fs.Uint64("seed", 0, "seed for every fault decision (0: pick one and print it)")
	parallel := fs.Int("parallel", runtime.NumCPU(), "cells at once (0: all); more than the machine can carry starves the harness, and the report says so")
	jsonOut := fs.String("json", "", "write the report as JSON to `FILE`")
	htmlOut := fs.String("html", "", "write a self-contained HTML report to `FILE`")
	dsn := fs.String("postgres-dsn", "", "PostgreSQL `DSN` for postgres cells (each gets its own schema; none: skipped)")
	pgBin := fs.String("postgres-bin", "", "`DIR` of initdb and postgres for the private cluster a postgres-restart cell crashes (none: initdb on PATH, else pg_config --bindir)")
	redisAddr := fs.String("redis-addr", "", "Redis `ADDR` for redis cells (none: a private redis-server per cell)")
	redlockAddrs := fs.String("redlock-addrs", "", "Redis node `ADDRS` for redlock, comma-separated (none: 3 private nodes per cell)")
	etcdEndpoints := fs.String("etcd-endpoints", "", "etcd member `ADDRS` for etcd cells, comma-separated (none: a private 3-member cluster per cell)")
	tempDir := fs.String("temp-dir", "", "`DIR` for the cells' SQLite files and private PostgreSQL cluster (none: the system's temp dir); SQLite syncs every commit, so put it on the disk you would deploy on")
	if code, ok := e.parseNoArgs(fs, args); !ok {
		return code
	}
	// A bad --faults is reported with the other flags' problems, not alone.
	scenarios, faultsErr := compare.ParseScenarios(*faults)
	if faultsErr != nil {
		faultsErr = fmt.Errorf("--faults: %w", faultsErr)
		scenarios = []string{compare.FaultNone}
	}
	o := compare.Options{
		Claimers: splitList(*claimers), Faults: scenarios, Replicas: *replicas, Jobs: *jobs,
		Duration: *duration, Lease: *lease, MaxClockSkew: *skew, Seed: *seed, Parallel: *parallel,
		PostgresDSN: *dsn, PostgresBin: *pgBin, RedisAddr: *redisAddr, RedlockAddrs: splitList(*redlockAddrs),
		EtcdEndpoints: splitList(*etcdEndpoints), TempDir: *tempDir, Progress: e.stderr, TTY: isTerminal(e.stderr),
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64N(1<<31) + 1
	}
	if err := errors.Join(faultsErr, o.Validate()); err != nil {
		fmt.Fprintln(e.stderr, "scheduler compare: bad usage:")
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(e.stderr, "  "+line)
		}
		return ExitUsage
	}
	ctx, stop := e.stoppable("compare")
	defer stop()
	rep, err := compare.Run(ctx, o)
	if err != nil {
		return e.fail("compare: %v", err)
	}
	_ = rep.WriteText(e.stdout)
	for _, out := range []struct {
		path  string
		write func(*os.File) error
	}{
		{*jsonOut, func(f *os.File) error { return rep.WriteJSON(f) }},
		{*htmlOut, func(f *os.File) error { return rep.WriteHTML(f) }},
	} {
		if out.path == "" {
			continue
		}
		if err := writeFile(out.path, out.write); err != nil {
			return e.fail("compare: %v", err)
		}
	}
	if !rep.OK {
		return ExitRuntime
	}
	return ExitOK
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func writeFile(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
