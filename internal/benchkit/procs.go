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
	"sync"
	"sync/atomic"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
)

// The scale scenario with replica processes: the parent prepares the
// namespace, starts one process per replica (ScaleOptions.ReplicaCmd),
// sends each its replicaArgs as one JSON line on its stdin, reads its
// events as JSON lines on its stdout, and tells them to stop on their stdin
// once every run started and every loser saw it done. Replicas then share
// no Go scheduler, as on separate hosts.

// replicaArgs are one replica process's arguments.
type replicaArgs struct {
	// Claimer reaches the namespace the parent prepared (its
	// claimers.Namespace's Config); the replica opens it with claimers.Open.
	Claimer       config.Claimer
	Instance      string
	Jobs          int
	Lease, Spread time.Duration
	Instant       time.Time // when every job falls due (see instantSpec)
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

// ReplicaMain is one replica process of the scale scenario: it reads its
// arguments from the first line of stdin, and returns when the next says
// stop (or stdin closes).
func ReplicaMain(stdin io.Reader, stdout io.Writer) error {
	in := bufio.NewReader(stdin)
	var a replicaArgs
	first, err := in.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(first, &a)
	}
	if err != nil {
		return fmt.Errorf("replica arguments on stdin: %w", err)
	}
	var mu sync.Mutex
	w := bufio.NewWriter(stdout)
	enc := json.NewEncoder(w)
	say := func(l line) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(l)
	}
	flush := func() { mu.Lock(); _ = w.Flush(); mu.Unlock() }
	b, err := claimers.Open(context.Background(), a.Claimer, a.Instance, claimers.Options{})
	if err != nil {
		return err
	}
	defer b.Close()
	var calls atomic.Int64
	now := time.Now

	runtime.GC()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	jobs, err := scaleJobs(a.Jobs, a.Instant)
	if err != nil {
		return err
	}
	r, err := runner.New(runner.Options{Claimer: counting{Claimer: b, calls: &calls}, ClaimerName: a.Claimer.Kind,
		Controls: control.New(b.Controls, nil), Instance: a.Instance, Lease: a.Lease, Spread: a.Spread, Now: now, Observe: func(e runner.Event) {
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

	_, _ = in.ReadString('\n') // "stop", or EOF
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
	n, err := s.isolate(ctx, o.Kind)
	if err != nil {
		return fail(err)
	}
	defer n.close()
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
		a := replicaArgs{Claimer: n.Config, Instance: fmt.Sprintf("r%d", i), Jobs: o.Jobs, Lease: o.Lease,
			Spread: o.Spread, Instant: instant}
		cmd := exec.CommandContext(ctx, o.ReplicaCmd[0], o.ReplicaCmd[1:]...)
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
		if err := json.NewEncoder(in).Encode(a); err != nil {
			return fail(err)
		}
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
