// Command scheduler-bench measures every claimer against the raw clients it
// is built on (go-redis, pgx, redis-benchmark, pgbench), runs the 10,000
// jobs × 3 replicas scale scenario, merges the peer libraries' rows written
// by the nested bench module, and prints one table (plus JSON and an SVG
// chart). bench/run.sh is the one command that runs everything.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/benchkit"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/procs"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		o         benchkit.Options
		s         benchkit.Services
		conc      = flag.String("c", "1,16", "concurrencies")
		kinds     = flag.String("claimers", "memory,sqlite,postgres,redis,redlock,etcd", "claimers to measure")
		scale     = flag.String("scale", "postgres,redis,redlock,sqlite,etcd", "claimers for the scale scenario (\"\" for none)")
		scaleOpts benchkit.ScaleOptions
		redlock   = flag.String("redlock", "", "comma-separated Redlock nodes (default: start 5 private redis-server)")
		peers     = flag.String("peers", "", "JSON rows of the peer libraries to merge (written by bench/)")
		jsonOut   = flag.String("json", "", "write the report as JSON to this file")
		svgOut    = flag.String("svg", "", "write a bar chart of ops/s as SVG to this file")
		curveOut  = flag.String("curve", "", "write the scale scenarios' lag against jobs (log-log) as SVG to this file")
		jobs      = flag.String("jobs", "10000", "jobs due at one instant in the scale scenario; a list runs each size")
		replicas  = flag.String("replicas", "3", "replicas in the scale scenario; a list runs each count")
		smoke     = flag.Bool("smoke", false, "seconds, not minutes: 50ms measurements, 60 jobs on a 1.5s lease")
		cpuprof   = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
		inProc    = flag.Bool("in-process", false, "scale scenario: run the replicas as goroutines of this process, not as processes")
		replica   = flag.Bool("replica", false, "internal: run as one replica process of the scale scenario (arguments on stdin)")
	)
	flag.DurationVar(&o.Duration, "duration", 2*time.Second, "measurement time per row and concurrency")
	flag.StringVar(&s.PostgresDSN, "postgres", env("SCHEDULER_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN")
	flag.StringVar(&s.RedisAddr, "redis", env("SCHEDULER_TEST_REDIS_ADDR", "127.0.0.1:6379"), "Redis address")
	flag.DurationVar(&scaleOpts.Spread, "spread", 0, "runner spread in the scale scenario (0: the runner's default; negative: none)")
	flag.Parse()
	if *replica {
		if err := benchkit.ReplicaMain(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "scheduler-bench replica:", err)
			return 1
		}
		return 0
	}
	if !*inProc {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "scheduler-bench:", err)
			return 1
		}
		scaleOpts.ReplicaCmd = []string{self, "-replica"}
	}
	if *smoke {
		// Each row and each scale scenario only has to produce numbers:
		// the shortest measurement that still does, and a lease short
		// enough that the scale scenario's losers see their runs done
		// within a second (at the default 6s they re-check every 2s).
		o.Duration, *jobs, scaleOpts.Lead, scaleOpts.Lease = 50*time.Millisecond, "60", time.Second, 1500*time.Millisecond
	}
	var err error
	sizes, err := benchkit.ParseCounts("job count", *jobs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scheduler-bench:", err)
		return 2
	}
	fleets, err := benchkit.ParseCounts("replica count", *replicas)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scheduler-bench:", err)
		return 2
	}
	if o.Concurrencies, err = benchkit.ParseConcurrencies(*conc); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler-bench:", err)
		return 2
	}
	o.Kinds = strings.FieldsFunc(*kinds, func(r rune) bool { return r == ',' })
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "scheduler-bench:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	dir, err := os.MkdirTemp("", "scheduler-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "scheduler-bench:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	s.Dir = dir
	if *redlock != "" {
		s.RedlockAddrs = strings.Split(*redlock, ",")
	} else if nodes, err := benchkit.StartRedisNodes(5, dir); err != nil {
		o.Log.Warn("no redlock nodes", "error", err.Error())
	} else {
		defer nodes.Stop()
		s.RedlockAddrs = nodes.Addrs
	}

	if etcd, err := startEtcd(ctx, dir, *kinds+","+*scale); err != nil {
		o.Log.Warn("no etcd cluster", "error", err.Error())
	} else if etcd != nil {
		defer etcd.Close()
		s.EtcdEndpoints = etcd.Endpoints()
	}

	host, _ := os.Hostname()
	rep := benchkit.Report{When: time.Now().UTC(), Host: host}
	if *peers != "" {
		b, err := os.ReadFile(*peers)
		if err == nil {
			err = json.Unmarshal(b, &rep.Rows)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "scheduler-bench: peers:", err)
			return 1
		}
	}
	if len(o.Kinds) > 0 {
		rep.Rows = append(rep.Rows, benchkit.Claimers(ctx, s, o)...)
	}
	for _, kind := range strings.FieldsFunc(*scale, func(r rune) bool { return r == ',' }) {
		for _, n := range sizes {
			for _, rs := range fleets {
				so := scaleOpts
				so.Kind, so.Jobs, so.Replicas = kind, n, rs
				o.Log.Info("scale scenario", "claimer", kind, "jobs", so.Jobs, "replicas", so.Replicas)
				rep.Scale = append(rep.Scale, benchkit.RunScale(ctx, s, so))
			}
		}
	}
	rep.Finish()
	rep.WriteTable(os.Stdout)
	for path, write := range map[string]func(*os.File) error{
		*jsonOut:  func(f *os.File) error { return rep.WriteJSON(f) },
		*svgOut:   func(f *os.File) error { return rep.WriteSVG(f) },
		*curveOut: func(f *os.File) error { return rep.WriteCurveSVG(f) },
	} {
		if path == "" {
			continue
		}
		f, err := os.Create(path)
		if err == nil {
			err = write(f)
			err = errorsJoin(err, f.Close())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "scheduler-bench:", err)
			return 1
		}
	}
	return 0
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// startEtcd starts a private 3-member etcd cluster when etcd is among the
// claimers measured or scaled (nil otherwise), its data in dir.
func startEtcd(ctx context.Context, dir, kinds string) (*procs.Etcd, error) {
	if !slices.Contains(strings.Split(kinds, ","), config.ClaimerEtcd) {
		return nil, nil
	}
	return procs.StartEtcd(ctx, procs.EtcdOptions{Dir: filepath.Join(dir, "etcd"), Members: 3})
}
