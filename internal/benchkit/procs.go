package benchkit

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/sqlite"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
)

// The scale scenario with replica processes: the parent prepares the
// namespace, starts one process per replica (ScaleOptions.ReplicaCmd plus
// ReplicaArgs), reads their events as JSON lines on their stdout, and tells
// them to stop on their stdin once every run started and every loser saw
// it done. Replicas then share no Go scheduler, as on separate hosts.

// ReplicaArgs are one replica process's arguments, parsed by ParseReplica.
type ReplicaArgs struct {
	Kind, Namespace, Instance string
	PostgresDSN, RedisAddr    string
	RedlockAddrs              []string
	Jobs                      int
	Lease, Spread             time.Duration
	MaxClaims                 int
	NoBatch, NoBatchRelease   bool
	Instant                   time.Time // when every job falls due (see instantSpec)
}

func (a ReplicaArgs) list() []string {
	return []string{"-kind", a.Kind, "-ns", a.Namespace, "-instance", a.Instance, "-postgres", a.PostgresDSN,
		"-redis", a.RedisAddr, "-redlock", strings.Join(a.RedlockAddrs, ","), "-jobs", strconv.Itoa(a.Jobs), "-lease", a.Lease.String(), "-spread", a.Spread.String(),
		"-max-claims", strconv.Itoa(a.MaxClaims), "-no-batch=" + strconv.FormatBool(a.NoBatch),
		"-no-batch-release=" + strconv.FormatBool(a.NoBatchRelease), "-instant", a.Instant.UTC().Format(time.RFC3339)}
}

// line is one message of a replica process.
type line struct {
	K     string  `json:"k"`               // ready, s(tarted), d(one), end
	ID    string  `json:"id,omitempty"`    // s
	Lag   int64   `json:"lag,omitempty"`   // s, ns
	Heap  float64 `json:"heap,omitempty"`  // ready: bytes per job
	CPU   int64   `json:"cpu,omitempty"`   // end, ns since ready
	Calls int64   `json:"calls,omitempty"` // end
	Err   string  `json:"err,omitempty"`
}

// attach opens claimers on a namespace another process prepared.
func (s Services) attach(kind, ns string) (func(instance string) (claim.Claimer, error), error) {
	switch kind {
	case "postgres":
		cfg, err := pgxpool.ParseConfig(s.PostgresDSN)
		if err != nil {
			return nil, err
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = ns
		return func(instance string) (claim.Claimer, error) {
			p, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				return nil, err
			}
			return postgres.New(p, postgres.Options{Instance: instance}), nil
		}, nil
	case "redis":
		return func(instance string) (claim.Claimer, error) {
			c := goredis.NewClient(&goredis.Options{Addr: s.RedisAddr, ContextTimeoutEnabled: true})
			return redis.New(c, redis.Options{Instance: instance, Prefix: ns, DoneTTL: 10 * time.Minute}), nil
		}, nil
	case "sqlite":
		return func(instance string) (claim.Claimer, error) {
			return sqlite.Open(context.Background(), ns, sqlite.Options{Instance: instance})
		}, nil
	case "redlock":
		return func(instance string) (claim.Claimer, error) { return openRedlock(s.RedlockAddrs, ns, instance) }, nil
	}
	return nil, fmt.Errorf("kind %q cannot run in replica processes", kind)
}

// ReplicaMain is one replica process of the scale scenario; it returns
// when stdin says stop (or closes).
func ReplicaMain(a ReplicaArgs, stdin io.Reader, stdout io.Writer) error {
	var mu sync.Mutex
	w := bufio.NewWriter(stdout)
	enc := json.NewEncoder(w)
	say := func(l line) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(l)
	}
	flush := func() { mu.Lock(); _ = w.Flush(); mu.Unlock() }
	open, err := (Services{PostgresDSN: a.PostgresDSN, RedisAddr: a.RedisAddr, RedlockAddrs: a.RedlockAddrs}).attach(a.Kind, a.Namespace)
	if err != nil {
		return err
	}
	inner, err := open(a.Instance)
	if err != nil {
		return err
	}
	defer inner.Close()
	var calls atomic.Int64
	c, _, _ := counted(inner, &calls, a.NoBatch, a.NoBatchRelease)
	now := time.Now

	runtime.GC()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	jobs := make([]runner.Job, a.Jobs)
	for j := range jobs {
		sched, err := schedule.Parse(instantSpec(a.Instant), "UTC")
		if err != nil {
			return err
		}
		jobs[j] = runner.Job{Name: fmt.Sprintf("scale.%05d", j), Schedule: sched, Grace: time.Second,
			Handler: func(context.Context, job.Run) error { return nil }}
	}
	r, err := runner.New(runner.Options{Claimer: c, ClaimerName: a.Kind, Instance: a.Instance, Lease: a.Lease,
		Spread: a.Spread, MaxClaims: a.MaxClaims, Now: now, Observe: func(e runner.Event) {
			switch {
			case e.Kind == runner.EventStarted:
				say(line{K: "s", ID: e.Run.ID(), Lag: int64(now().Sub(e.Run.At))})
			case e.Kind == runner.EventSkipped && e.Reason == runner.ReasonDone:
				say(line{K: "d"})
			}
		}}, jobs)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	go func() {
		for {
			select {
			case <-done:
				return
			case <-ticker.C:
				flush()
			}
		}
	}()

	time.Sleep(500 * time.Millisecond) // Run has pushed every job; nothing is due yet
	runtime.GC()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	cpu0 := cpuTime()
	calls.Store(0)
	say(line{K: "ready", Heap: float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(a.Jobs)})
	flush()

	_, _ = bufio.NewReader(stdin).ReadString('\n') // "stop", or EOF
	cpu := cpuTime() - cpu0
	n := calls.Load()
	cancel()
	<-done
	say(line{K: "end", CPU: int64(cpu), Calls: n})
	flush()
	return nil
}

// runScaleProcs is RunScale with one process per replica.
func runScaleProcs(ctx context.Context, s Services, o ScaleOptions, res Scale) Scale {
	fail := func(err error) Scale { res.Error = err.Error(); return res }
	b, err := s.openBackend(ctx, o.Kind)
	if err != nil {
		return fail(err)
	}
	defer b.close()
	ns := map[string]string{"postgres": b.schema, "redis": b.prefix, "redlock": b.prefix, "sqlite": b.path}[o.Kind]
	if c, err := b.open("setup"); err != nil { // migrates a SQLite file
		return fail(err)
	} else if o.Kind == "sqlite" {
		_ = c.Close()
	}
	lead := o.Lead + 3*time.Second // process start, 10,000 jobs, the idle heap
	instant := time.Now().Add(lead).Truncate(time.Second).Add(time.Second)

	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		lines chan line
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			_ = p.stdin.Close()
			_ = p.cmd.Wait()
		}
	}()
	for i := range o.Replicas {
		a := ReplicaArgs{Kind: o.Kind, Namespace: ns, Instance: fmt.Sprintf("r%d", i), PostgresDSN: s.PostgresDSN,
			RedisAddr: s.RedisAddr, RedlockAddrs: s.RedlockAddrs, Jobs: o.Jobs, Lease: o.Lease, Spread: o.Spread, MaxClaims: o.MaxClaims,
			NoBatch: o.NoBatch, NoBatchRelease: o.NoBatchRelease, Instant: instant}
		cmd := exec.CommandContext(ctx, o.ReplicaCmd[0], append(slices.Clone(o.ReplicaCmd[1:]), a.list()...)...)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return fail(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err)
		}
		if err := cmd.Start(); err != nil {
			return fail(err)
		}
		p := &proc{cmd: cmd, stdin: in, lines: make(chan line, 1024)}
		procs = append(procs, p)
		go func() {
			defer close(p.lines)
			dec := json.NewDecoder(out)
			for {
				var l line
				if err := dec.Decode(&l); err != nil {
					return
				}
				p.lines <- l
			}
		}()
	}

	starts := make(map[string]int, o.Jobs)
	shares := make([]int, o.Replicas)
	var lags []time.Duration
	var heap float64
	ready, doneSkips, ended := 0, 0, 0
	var cpu, calls int64
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			for _, p := range procs {
				_, _ = io.WriteString(p.stdin, "stop\n")
			}
		}
	}
	timeout := time.NewTimer(lead + o.Timeout)
	defer timeout.Stop()
	// Merge the replicas' lines until each has said end.
	type tagged struct {
		i  int
		l  line
		ok bool
	}
	merged := make(chan tagged)
	for i, p := range procs {
		go func() {
			for l := range p.lines {
				merged <- tagged{i, l, true}
			}
			merged <- tagged{i: i}
		}()
	}
	for open := len(procs); open > 0; {
		select {
		case t := <-merged:
			switch {
			case !t.ok:
				open--
			case t.l.K == "ready":
				ready++
				heap += t.l.Heap
			case t.l.K == "s":
				lags = append(lags, time.Duration(t.l.Lag))
				starts[t.l.ID]++
				shares[t.i]++
			case t.l.K == "d":
				doneSkips++
			case t.l.K == "end":
				ended++
				cpu += t.l.CPU
				calls += t.l.Calls
			}
			if len(lags) >= o.Jobs && doneSkips >= o.Jobs*(o.Replicas-1) {
				stop()
			}
		case <-timeout.C:
			res.Error = "timed out before every run started and every loser saw it done"
			stop()
		case <-ctx.Done():
			stop()
			return fail(ctx.Err())
		}
	}
	if ended != o.Replicas || ready != o.Replicas {
		return fail(fmt.Errorf("%d of %d replica processes ended normally (see stderr)", ended, o.Replicas))
	}
	res.HeapPerJob = heap / float64(o.Replicas)
	res.CallsPerRun = float64(calls) / float64(o.Jobs)
	res.CPUPerRunus = float64(cpu) / float64(o.Jobs) / float64(time.Microsecond)
	return finishScale(res, o.Jobs, starts, shares, lags)
}
