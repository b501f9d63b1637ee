package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/procs"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

var base = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// grant is one claim a replica won, with when its call was sent and
// answered.
type grant struct {
	run        int
	fence      int64
	start, end time.Time
}

// TestLeaderLossKeepsClaimsSingleAndFencesGrowing runs three replicas
// claiming and finishing one job's runs against a 3-member cluster while
// the leader is killed (SIGKILL), and later, with the member back, while
// leadership is moved to it. Claims go on through both changes; no run is
// granted twice; a grant that began after another ended has a higher
// fence; a run whose holder stopped before the kill is taken over after
// it, attempt 2, with a higher fence; the history agrees with the grants.
func TestLeaderLossKeepsClaimsSingleAndFencesGrowing(t *testing.T) {
	cluster := testenv.StartEtcd(t, 3)
	ns := backends.Prepare(t, "etcd", backends.Options{Servers: cluster.Endpoints()})
	replicas := []claim.Claimer{ns.Open("replica-a"), ns.Open("replica-b"), ns.Open("replica-c")}

	// Every replica bids for every run in turn until stopped; a step is
	// one replica's bid for one run.
	var (
		mu       sync.Mutex
		grants   []grant
		problems []error
		wg       sync.WaitGroup
		bids     int
	)
	// step never blocks: the replicas bid on while the test kills and
	// moves the leader.
	stop, step := make(chan struct{}), make(chan struct{}, 1<<20)
	for _, c := range replicas {
		wg.Go(func() {
			for i := 0; ; i++ {
				g, err := claimAndFinish(t, c, i)
				mu.Lock()
				if g != nil {
					grants = append(grants, *g)
				}
				if err != nil {
					problems = append(problems, err)
				}
				bids = max(bids, i+1)
				mu.Unlock()
				if err != nil {
					return
				}
				select {
				case <-stop:
					return
				default:
					step <- struct{}{}
				}
			}
		})
	}
	// await waits for steps bids made from now on.
	await := func(steps int) {
		t.Helper()
		for len(step) > 0 {
			<-step
		}
		timeout := time.After(60 * time.Second)
		for range steps {
			select {
			case <-step:
			case <-timeout:
				close(stop)
				wg.Wait()
				t.Fatalf("replicas made no progress for a minute: %v", problems)
			}
		}
	}

	const phase = 300 // steps: 100 runs over three replicas
	await(phase)
	// A holder that stops renewing just before the kill: its run must be
	// taken over once its lease has run out, the leader change between.
	orphan := claim.Run{Job: "job.orphan", At: base}
	first, err := claim.ClaimOne(ctxFor(t, 10*time.Second), replicas[0], orphan, testenv.EtcdLease)
	if err != nil {
		t.Fatal(err)
	}
	leader := leaderOf(t, cluster)
	killedAt := time.Now()
	leader.Stop()
	t.Logf("killed leader %s", leader.Name())

	second := takeOver(t, replicas[1], orphan)
	if second.Attempt != 2 || second.Fence <= first.Fence {
		t.Fatalf("takeover after the leader's death: attempt %d fence %d; want attempt 2, fence above %d",
			second.Attempt, second.Fence, first.Fence)
	}

	await(phase)
	if err := leader.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	moveLeader(t, cluster, leader)
	movedAt := time.Now()
	t.Logf("moved leadership to %s", leader.Name())

	await(phase)
	close(stop)
	wg.Wait()
	for _, err := range problems {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	perRun := map[int]int{}
	var afterKill, afterMove int
	for _, g := range grants {
		perRun[g.run]++
		if g.start.After(killedAt) {
			afterKill++
		}
		if g.start.After(movedAt) {
			afterMove++
		}
	}
	for run, n := range perRun {
		if n > 1 {
			t.Errorf("run %d granted %d times", run, n)
		}
	}
	if afterKill == 0 || afterMove == 0 {
		t.Errorf("grants after the kill %d, after the move %d: claims did not go on", afterKill, afterMove)
	}
	// A grant that began after another one ended must have a higher fence.
	byEnd := slices.SortedFunc(slices.Values(grants), func(a, b grant) int { return a.end.Compare(b.end) })
	byStart := slices.SortedFunc(slices.Values(grants), func(a, b grant) int { return a.start.Compare(b.start) })
	var (
		k      int
		before grant // the highest fence of the grants ended so far
	)
	for _, g := range byStart {
		for ; k < len(byEnd) && byEnd[k].end.Before(g.start); k++ {
			if byEnd[k].fence > before.fence {
				before = byEnd[k]
			}
		}
		if g.fence <= before.fence {
			t.Fatalf("run %d granted with fence %d after run %d's grant with fence %d had been answered: fences went back",
				g.run, g.fence, before.run, before.fence)
		}
	}

	recs, err := replicas[2].History(ctxFor(t, 10*time.Second), "job.failover", 0)
	if err != nil {
		t.Fatal(err)
	}
	fences := map[string]int64{}
	for _, r := range recs {
		fences[r.RunID] = r.Fence
	}
	for _, g := range grants {
		id := runAt(g.run).ID()
		if fences[id] != g.fence {
			t.Errorf("history has %s with fence %d, granted with %d", id, fences[id], g.fence)
		}
	}
	t.Logf("%d runs, %d grants, %d after the kill, %d after the move, %d calls retried; the other runs held by grants whose answer was lost",
		bids, len(grants), afterKill, afterMove, retried.Load())
}

// retried counts the calls a leader change failed, which the replicas
// made again.
var retried atomic.Int64

func runAt(i int) claim.Run {
	return claim.Run{Job: "job.failover", At: base.Add(time.Duration(i) * time.Minute)}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// unavailable says whether err is a call that a leader change may fail:
// the cluster could not answer, or not within the call's deadline.
func unavailable(err error) bool {
	return errors.Is(err, claim.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// claimAndFinish bids for run i once the cluster answers, and releases it
// as succeeded if it won. The lease outlasts the test: every grant is the
// run's only one. A grant whose answer was lost holds its run unexecuted.
func claimAndFinish(t *testing.T, c claim.Claimer, i int) (*grant, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		start := time.Now()
		cl, err := claim.ClaimOne(ctx, c, runAt(i), time.Hour)
		end := time.Now()
		cancel()
		switch {
		case errors.Is(err, claim.ErrHeld) || errors.Is(err, claim.ErrDone):
			return nil, nil
		case err == nil:
			g := &grant{run: i, fence: cl.Fence, start: start, end: end}
			return g, release(t, c, cl, deadline)
		case !unavailable(err) || time.Now().After(deadline):
			return nil, fmt.Errorf("claim run %d: %w", i, err)
		}
		retried.Add(1)
		time.Sleep(50 * time.Millisecond) // the cluster is electing a leader
	}
}

func release(t *testing.T, c claim.Claimer, cl *claim.Claim, deadline time.Time) error {
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := claim.ReleaseOne(ctx, c, cl, claim.Succeeded)
		cancel()
		if err == nil || !unavailable(err) || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("release %s: %w", cl.ID(), err)
			}
			return nil
		}
		retried.Add(1)
		time.Sleep(50 * time.Millisecond) // the cluster is electing a leader
	}
}

// takeOver polls until c wins run, whose holder stopped renewing. It bids
// with the lease the holder had, as replicas of one configuration do:
// after the calls the leader's death left unanswered, a claimer holds
// takeovers back until the cluster has answered for the lease it bids
// with (claim.Unanswered), which for a bid of an hour is an hour.
func takeOver(t *testing.T, c claim.Claimer, run claim.Run) *claim.Claim {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cl, err := claim.ClaimOne(ctxFor(t, 2*time.Second), c, run, testenv.EtcdLease)
		switch {
		case err == nil:
			return cl
		case !errors.Is(err, claim.ErrHeld) && !unavailable(err):
			t.Fatalf("takeover of %s: %v", run.ID(), err)
		case time.Now().After(deadline):
			t.Fatalf("takeover of %s: not granted within 30s: %v", run.ID(), err)
		}
		time.Sleep(50 * time.Millisecond) // a lease expiring on the cluster; no event to wait on
	}
}

// client is an etcd client of the given members alone.
func client(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// leaderOf returns the member the running members agree leads.
func leaderOf(t *testing.T, e *procs.Etcd) *procs.EtcdMember {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ids := map[uint64]*procs.EtcdMember{}
		var leader uint64
		for _, m := range e.Members() {
			if !m.Running() {
				continue
			}
			st, err := client(t, m.Addr()).Status(ctxFor(t, 2*time.Second), m.Addr())
			if err != nil {
				continue
			}
			ids[st.Header.MemberId] = m
			if leader == 0 {
				leader = st.Leader
			}
		}
		if m, ok := ids[leader]; ok {
			return m
		}
	}
	t.Fatal("no leader found within 15s")
	return nil
}

// moveLeader transfers leadership to m, a running member that does not
// lead.
func moveLeader(t *testing.T, e *procs.Etcd, to *procs.EtcdMember) {
	t.Helper()
	st, err := client(t, to.Addr()).Status(ctxFor(t, 5*time.Second), to.Addr())
	if err != nil {
		t.Fatal(err)
	}
	from := leaderOf(t, e)
	if from == to {
		return
	}
	if _, err := client(t, from.Addr()).MoveLeader(ctxFor(t, 10*time.Second), st.Header.MemberId); err != nil {
		t.Fatalf("move leadership to %s: %v", to.Name(), err)
	}
	if got := leaderOf(t, e); got != to {
		t.Fatalf("leader after the move is %s, want %s", got.Name(), to.Name())
	}
}
