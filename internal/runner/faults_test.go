package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/job"
)

// Fault scenarios run three replicas of a per-second job whose handler works
// for 1.5s (so every run is renewed) on a 3s lease: renewals every 1s, claim
// timeout 1s, trust margin 300ms. Replica "faulty" reaches the backend
// through the fault injector; its clock is 300ms ahead, so it usually bids
// first and holds the runs when a fault hits. The others reach the backend
// directly.
const (
	faultLease = 3 * time.Second
	faultWork  = 1500 * time.Millisecond
	warmUp     = 3 * time.Second // from start to the earliest fault
	recovery   = 8 * time.Second // from the fault's end to shutdown
	// Instants checked: from start+checkFrom to shutdown−checkTail. The
	// tail leaves a late instant time for one lease (a lost grant's ghost)
	// plus a takeover bid before shutdown stops bidding.
	checkFrom = 2 * time.Second
	checkTail = 5 * time.Second
)

// faultCase is one fault, armed on the faulty replica between its start and
// its end.
type faultCase struct {
	name string
	// hold makes the faulty replica's handlers, once their work is done,
	// wait until the fault ends (long jobs), and the fault start only once
	// one does: the fault then hits a replica that holds runs.
	hold bool
	// leaseLost: every run held on the faulty replica when the fault starts
	// must be cancelled with cause job.ErrLeaseLost.
	leaseLost bool
	// atLeastOnce: the fault is beyond what a lease can cover, so an instant
	// may succeed twice (one after the other, never concurrently).
	atLeastOnce bool
	// drops: the fault loses requests or replies, and must have lost some.
	drops  bool
	window time.Duration
	// repeat re-arms start every repeat within the window.
	repeat      time.Duration
	start, stop func(injector)
}

var faultCases = []faultCase{
	// A round trip of 900ms is under the claim timeout (lease/3, 1s): a
	// renewal or release sent on the lease pool's open connection lands
	// in one. When it had to connect first, or prepare its statement on
	// a new connection, it took two or three, and the postgres row failed
	// one CI run in two: a finished run's renewals and release landed
	// after its lease, and another replica ran it again (the behaviour of
	// a round trip past the timeout, which "latency 1s each way" covers).
	{name: "latency 450ms each way", window: 6 * time.Second,
		start: func(in injector) { in.SetLatency(450 * time.Millisecond) },
		stop:  func(in injector) { in.SetLatency(0) }},
	// A round trip of 2s is beyond it, and a renewal no longer returns
	// within the trust window: the replica cannot claim, and a run it held
	// when the latency began may finish without its release landing
	// before the lease ends (more so on a new connection, whose set-up
	// costs round trips too). Another replica then runs it again: never
	// at the same time, which is what fencing relies on.
	{name: "latency 1s each way", window: 6 * time.Second, atLeastOnce: true,
		start: func(in injector) { in.SetLatency(time.Second) },
		stop:  func(in injector) { in.SetLatency(0) }},
	{name: "reset during claim (request lost)", drops: true, window: 6 * time.Second, repeat: 400 * time.Millisecond,
		start: func(in injector) { in.DropRequests(phClaim, 1) },
		stop:  func(in injector) { in.DropRequests(phClaim, 0) }},
	{name: "reply to a granted claim swallowed", drops: true, window: 6 * time.Second, repeat: 3500 * time.Millisecond,
		start: func(in injector) { in.DropReplies(phClaim, 1, true) },
		stop:  func(in injector) { in.DropReplies(phClaim, 0, true) }},
	{name: "reset during renew (request lost)", drops: true, window: 6 * time.Second, repeat: 400 * time.Millisecond,
		start: func(in injector) { in.DropRequests(phRenew, 1) },
		stop:  func(in injector) { in.DropRequests(phRenew, 0) }},
	{name: "renewal replies swallowed > lease", drops: true, hold: true, leaseLost: true, window: 5 * time.Second,
		start: func(in injector) { in.DropReplies(phRenew, 1<<30, false) },
		stop:  func(in injector) { in.DropReplies(phRenew, 0, false) }},
	{name: "reset during release (after it took effect)", drops: true, window: 6 * time.Second, repeat: 400 * time.Millisecond,
		start: func(in injector) { in.DropReplies(phRelease, 1, true) },
		stop:  func(in injector) { in.DropReplies(phRelease, 0, true) }},
	{name: "partition of the holder > lease", hold: true, leaseLost: true, window: 5 * time.Second,
		start: func(in injector) { in.Partition(true) },
		stop:  func(in injector) { in.Partition(false) }},
}

// seenEvent is an event as a replica reported it, and when.
type seenEvent struct {
	runner.Event
	at time.Time
}

// execution is one handler call.
type execution struct {
	id, instance string
	attempt      int
	start, end   time.Time
	err, cause   error
}

// faultRun is one scenario's record.
type faultRun struct {
	faulty string
	mu     sync.Mutex
	execs  []execution
	events map[string][]seenEvent // per instance
	// log is what every replica reported (their Observe hooks), judged by
	// history.Check. It logs no grants on purpose: history cuts an
	// execution where its lease could end, and the table asserts more,
	// that a handler never outlives its lease into a successor's run.
	log    *history.Log
	hold   chan struct{}   // non-nil while handlers hold; closed to let go
	inHold map[string]bool // id#attempt of faulty handlers holding now
}

func execKey(id string, attempt int) string { return fmt.Sprintf("%s#%d", id, attempt) }

func (s *faultRun) observe(instance string) func(runner.Event) {
	logged := s.log.Observer(instance, nil)
	return func(e runner.Event) {
		s.mu.Lock()
		s.events[instance] = append(s.events[instance], seenEvent{e, time.Now()})
		s.mu.Unlock()
		logged(e)
	}
}

func (s *faultRun) handler(ctx context.Context, run job.Run) error {
	start := time.Now()
	err := sleepCtx(ctx, faultWork)
	s.mu.Lock()
	hold := s.hold
	s.mu.Unlock()
	if err == nil && hold != nil && run.Instance == s.faulty {
		key := execKey(run.ID, run.Attempt)
		s.setHolding(key, true)
		select {
		case <-hold:
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.setHolding(key, false)
	}
	end := time.Now()
	s.mu.Lock()
	s.execs = append(s.execs, execution{id: run.ID, instance: run.Instance, attempt: run.Attempt,
		start: start, end: end, err: err, cause: context.Cause(ctx)})
	s.mu.Unlock()
	return err
}

func (s *faultRun) setHolding(key string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.inHold[key] = true
	} else {
		delete(s.inHold, key)
	}
}

func (s *faultRun) holding() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.inHold {
		keys = append(keys, k)
	}
	return keys
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// faultRow is one line of the fault table.
type faultRow struct {
	claimer, fault                    string
	instants, executions              int
	concurrent, twice, lost           int
	leaseLost, takeovers, misreported int
	recovered                         bool
	heldAtFault                       int
	stall                             time.Duration
}

// TestFaults drives every fault against every claimer and checks, for each
// pair: no run executes on two replicas at once, no instant succeeds twice,
// every instant in the checked window succeeds once by shutdown, runs held
// through a fault that outlasts the lease are cancelled with ErrLeaseLost,
// and the faulty replica talks to its backend again after the fault.
func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock test: about two minutes")
	}
	testenv.WallClock(t)
	nodes := testenv.RedlockAddrs(t, 5)
	stalls := watchStalls(t)
	type target struct {
		kind    string
		proxied int // redlock: nodes behind the faulty replica's proxies
		label   string
	}
	var targets []target
	for _, k := range []string{"postgres", "redis", "sqlite", "memory"} {
		targets = append(targets, target{k, 0, k})
	}
	targets = append(targets, target{"redlock", 3, "redlock (3 of 5 nodes faulty)"})

	var mu sync.Mutex
	var rows []faultRow
	var group sync.WaitGroup
	run := func(tg target, fc faultCase) {
		group.Go(func() {
			t.Run(tg.kind+"/"+fc.name, func(t *testing.T) {
				row := faultScenario(t, tg.kind, nodes, tg.proxied, fc, stalls)
				row.claimer = tg.label
				mu.Lock()
				rows = append(rows, row)
				mu.Unlock()
			})
		})
	}
	// claimersAtOnce claimers' scenarios at a time, each claimer's all at
	// once: every scenario runs three replicas, and forty of them side by
	// side on a small machine starve the very timers (renewals, trust
	// windows) they assert on, so a row would say more about the machine
	// than about the claimer. The scenarios wait on wall time far more
	// than they compute (one claimer's at a time kept 20% of a core busy
	// under the race detector, 94 s in all), but three claimers' at once
	// failed a CI run (stop 69): under "latency 450ms each way" a redis
	// renewal that had to connect anew (a HELLO round trip first) missed
	// its trust window, and a finished run's lease lapsed before its
	// release, on a new connection too, landed. One at a time again.
	for i, tg := range targets {
		for _, fc := range faultCases {
			run(tg, fc)
		}
		if tg.kind == "redlock" {
			// Quorum: one node of five partitioned away costs nothing.
			one := faultCases[len(faultCases)-1]
			one.leaseLost = false
			one.name = "partition of one node > lease"
			run(target{"redlock", 1, "redlock (1 of 5 nodes faulty)"}, one)
		}
		if (i+1)%claimersAtOnce == 0 || i == len(targets)-1 {
			group.Wait()
		}
	}

	order := map[string]int{}
	for i, fc := range faultCases {
		order[fc.name] = i
	}
	slices.SortStableFunc(rows, func(a, b faultRow) int {
		if c := strings.Compare(a.claimer, b.claimer); c != 0 {
			return c
		}
		return order[a.fault] - order[b.fault]
	})
	table := faultTable(rows)
	t.Log("\n" + table)
	if dir := os.Getenv("SCHEDULER_ARTIFACTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "fault-table.md"), []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// claimersAtOnce is how many claimers' fault scenarios TestFaults runs
// side by side.
const claimersAtOnce = 1

// stalledTries is how many times a scenario runs while the test process
// stalls beyond stallBudget under it and its checks fail.
const stalledTries = 3

// faultScenario runs fc against kind and reports every violation of its
// guarantees. A scenario whose run found violations while the test
// process stalled beyond stallBudget is run again: a lease covers a
// replica that is slow, not one that is not running, so such a run
// cannot tell a bug from the stall. The checks are never waived: the
// last run's violations fail the test, stalled or not.
func faultScenario(t *testing.T, kind string, nodes []string, proxied int, fc faultCase, stalls *stallWatch) faultRow {
	t.Helper()
	for try := 1; ; try++ {
		row, failures := runFault(t, kind, nodes, proxied, fc, stalls)
		if len(failures) > 0 && row.stall > stallBudget && try < stalledTries {
			t.Logf("try %d stalled %v (beyond the %v a lease's promise allows), and its checks found %d violations; running the scenario again. The first: %s",
				try, row.stall.Round(time.Millisecond), stallBudget, len(failures), failures[0])
			continue
		}
		for _, f := range failures {
			t.Error(f)
		}
		if len(failures) > 0 && row.stall > stallBudget {
			t.Errorf("each of %d tries stalled beyond %v: the last stalled %v", stalledTries, stallBudget, row.stall.Round(time.Millisecond))
		}
		return row
	}
}

// runFault runs fc against kind once and returns its table row and the
// violations of its timing-dependent guarantees (faultScenario reports
// them).
func runFault(t *testing.T, kind string, nodes []string, proxied int, fc faultCase, stalls *stallWatch) (faultRow, []string) {
	const faulty = "faulty"
	be := openFaulty(t, kind, faulty, nodes, proxied)
	s := &faultRun{faulty: faulty, events: map[string][]seenEvent{}, log: history.NewLog(nil), inHold: map[string]bool{}}
	jobs := []runner.Job{{Name: "tick", Schedule: mustSchedule(t, "* * * * * *"), Handler: s.handler,
		// Runs of a per-second job with 1.5s of work overlap by design; a
		// run delayed by a fault then never costs the next one.
		Overlap: runner.OverlapAllow}}
	replicas := []struct {
		name string
		skew time.Duration
		c    claim.Claimer
	}{{faulty, 300 * time.Millisecond, be.faulty}, {"b", 0, be.healthy("b")}, {"c", -150 * time.Millisecond, be.healthy("c")}}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The replicas' logs are shown only if the scenario fails: they tell a
	// replica that could not reach its backend from one that never tried.
	logs := &testenv.Logs{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica logs:\n%s", logs.String())
			if px, ok := be.inject.(fmt.Stringer); ok {
				t.Logf("the faulty replica's proxies:\n%s", px)
			}
		}
	})
	var wg sync.WaitGroup
	begin := time.Now()
	for _, rp := range replicas {
		r, err := runner.New(runner.Options{
			Claimer: rp.c, ClaimerName: kind, Instance: rp.name, Logger: logger,
			Lease: faultLease, MaxClockSkew: 500 * time.Millisecond, ShutdownGrace: 5 * time.Second,
			Now: func() time.Time { return time.Now().Add(rp.skew) }, Observe: s.observe(rp.name),
		}, jobs)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = r.Run(ctx) })
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			wg.Wait()
		}
	}
	defer stop()

	time.Sleep(warmUp) // the replicas work on wall-clock instants
	var heldAtFault []string
	if fc.hold {
		s.mu.Lock()
		s.hold = make(chan struct{})
		s.mu.Unlock()
		deadline := time.Now().Add(15 * time.Second)
		// Let releases sent before the hold land, and wait for a run the
		// fault can hit.
		time.Sleep(time.Second)
		for heldAtFault = s.holding(); len(heldAtFault) == 0 && time.Now().Before(deadline); heldAtFault = s.holding() {
			time.Sleep(20 * time.Millisecond) // polling the handlers' state
		}
	}
	faultStart := time.Now()
	fc.start(be.inject)
	for end := faultStart.Add(fc.window); time.Now().Before(end); {
		wait := time.Until(end)
		if fc.repeat > 0 {
			wait = min(wait, fc.repeat)
		}
		time.Sleep(wait) // the fault lasts for wall time
		if fc.repeat > 0 && time.Now().Before(end) {
			fc.start(be.inject)
		}
	}
	fc.stop(be.inject)
	faultEnd := time.Now()
	if fc.hold {
		s.mu.Lock()
		close(s.hold)
		s.hold = nil
		s.mu.Unlock()
	}
	time.Sleep(recovery)
	end := time.Now()
	stop()

	row, failures := s.check(t, fc, kind, begin, end, faultStart, faultEnd, heldAtFault, stalls.worst(begin, time.Now()))
	if fc.drops && be.inject.Dropped() == 0 {
		failures = append(failures, "the fault never fired: no request or reply was lost")
	}
	return row, failures
}

// stallBudget is the longest stall of the test process (see stallWatch)
// under which a scenario's timing-dependent guarantees are asserted: the
// trust margin. A lease covers a replica that is slow, not one that is not
// running: when the process stalls for longer, a holder may finish its
// work and be unable to record it before its lease ends (the run then
// executes again, one after the other), or notice the end of its lease
// late (overlapping its successor, by about the stall). A scenario whose
// checks fail after such a stall is run again (faultScenario).
const stallBudget = faultLease / 10

// check checks the scenario's guarantees and returns its table row and
// the violations found.
func (s *faultRun) check(t *testing.T, fc faultCase, kind string, begin, end, faultStart, faultEnd time.Time,
	heldAtFault []string, stall time.Duration) (faultRow, []string) {
	t.Helper()
	row := faultRow{fault: fc.name, heldAtFault: len(heldAtFault), stall: stall}
	var failures []string
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	byID := map[string][]execution{}
	byKey := map[string]execution{}
	for _, e := range s.execs {
		byID[e.id] = append(byID[e.id], e)
		byKey[execKey(e.id, e.attempt)] = e
		if e.instance == s.faulty && errors.Is(e.cause, job.ErrLeaseLost) {
			row.leaseLost++
		}
	}
	sched := mustSchedule(t, "* * * * * *")
	for at := sched.Next(begin.Add(checkFrom)); !at.After(end.Add(-checkTail)); at = sched.Next(at) {
		id := claim.Run{Job: "tick", At: at}.ID()
		row.instants++
		ex := byID[id]
		row.executions += len(ex)
		slices.SortFunc(ex, func(a, b execution) int { return a.start.Compare(b.start) })
		// Handlers that returned nil: a run whose work was done twice, even
		// if the first holder could not record it (history's succeeded-twice
		// counts the successes replicas reported).
		succeeded := 0
		for _, e := range ex {
			if e.err == nil {
				succeeded++
			}
			if e.attempt > 1 {
				row.takeovers++
			}
		}
		switch {
		case succeeded > 1 && fc.atLeastOnce:
			row.twice++
			t.Logf("%s succeeded %d times, one after the other (beyond the lease's reach): %s", id, succeeded, describe(ex))
		case succeeded > 1:
			row.twice++
			fail("%s succeeded %d times: %s", id, succeeded, describe(ex))
		case succeeded == 0:
			row.lost++
			fail("%s never succeeded (fault %s–%s): %s", id, faultStart.Format("15:04:05.000"),
				faultEnd.Format("15:04:05.000"), describe(ex))
		}
	}
	for inst, evs := range s.events {
		for _, e := range evs {
			if e.Kind != runner.EventFinished || e.Status != claim.LeaseLost {
				continue
			}
			// The handler succeeded, nobody took the run over, and the
			// release had come back before the lease's deadline: it took
			// effect on a lease still held, so lease_lost would be a false
			// alarm. A release that came back only after the deadline
			// may have landed after it: another replica's bid can then
			// have been granted in between (on Redlock, on the majority
			// whose copies of the lease lapsed), see the run done on the
			// nodes the release reached, and withdraw, and the holder is
			// right to say its lease was lost.
			x, ok := byKey[execKey(e.Run.ID(), e.Claim.Attempt)]
			if ok && x.err == nil && x.instance == inst && len(byID[x.id]) == 1 && e.at.Before(e.Claim.Deadline) {
				row.misreported++
				fail("%s on %s: the handler succeeded and nobody took over, and the release came back at %s, before the lease's deadline %s, yet the run finished lease_lost: %v",
					e.Run.ID(), inst, e.at.Format("15:04:05.000"), e.Claim.Deadline.Format("15:04:05.000"), e.Err)
			}
		}
	}
	// The history checker judges what the replicas reported, for every
	// run: no run executes on two replicas at once (run-overlap: without
	// grants in the log, from a handler's start to its return), none is
	// reported succeeded twice, no takeover is skipped as a misfire.
	evs := s.log.Events()
	for _, v := range history.Check(evs, history.Spec{}) {
		switch {
		case v.Invariant == history.RunOverlap:
			row.concurrent++
			fail("history: %s\n  executions: %s", v.Format(begin), describe(byID[v.Run]))
		case v.Invariant == history.SucceededTwice && fc.atLeastOnce:
			t.Logf("history (beyond the lease's reach): %s", v.Format(begin))
		default:
			fail("history: %s\n  executions: %s", v.Format(begin), describe(byID[v.Run]))
		}
	}
	// Runs held when the fault began lose their lease to it.
	if fc.hold && len(heldAtFault) == 0 {
		fail("%s/%s: the faulty replica held no run when the fault began", kind, fc.name)
	}
	if fc.leaseLost {
		for _, k := range heldAtFault {
			if e, ok := byKey[k]; !ok || !errors.Is(e.cause, job.ErrLeaseLost) {
				fail("%s held on the faulty replica when the fault began: cause %v, want ErrLeaseLost", k, e.cause)
			}
		}
	}
	// The faulty replica talks to its backend again: it bids for (starts,
	// or finds held or done) an instant due a second after the fault.
	for _, e := range s.events[s.faulty] {
		if !e.Run.At.Before(faultEnd.Add(time.Second)) && (e.Kind == runner.EventStarted ||
			e.Kind == runner.EventSkipped && (e.Reason == runner.ReasonHeld || e.Reason == runner.ReasonDone)) {
			row.recovered = true
		}
	}
	if !row.recovered {
		fail("%s/%s: the faulty replica did not bid again after the fault ended", kind, fc.name)
	}
	if row.instants < 8 {
		t.Errorf("only %d instants checked", row.instants)
	}
	return row, failures
}

func describe(ex []execution) string {
	var parts []string
	for _, e := range ex {
		parts = append(parts, fmt.Sprintf("{%s attempt %d %s–%s err=%v cause=%v}", e.instance, e.attempt,
			e.start.Format("15:04:05.000"), e.end.Format("15:04:05.000"), e.err, e.cause))
	}
	return strings.Join(parts, " ")
}

func faultTable(rows []faultRow) string {
	var b strings.Builder
	b.WriteString("| claimer | fault | instants | executions | ran concurrently | succeeded twice | lost | faulty runs cancelled lease-lost | takeovers | false lease_lost | faulty replica recovered | worst stall |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
	for _, r := range rows {
		lost := fmt.Sprint(r.leaseLost)
		if r.heldAtFault > 0 {
			lost = fmt.Sprintf("%d (%d held at fault)", r.leaseLost, r.heldAtFault)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %s | %d | %d | %v | %v |\n", r.claimer, r.fault,
			r.instants, r.executions, r.concurrent, r.twice, r.lost, lost, r.takeovers, r.misreported, r.recovered,
			r.stall.Round(time.Millisecond))
	}
	return b.String()
}
