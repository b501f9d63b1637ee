package main_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// A `trigger --here` process killed (SIGKILL) or stopped (SIGTERM) mid-run
// leaves a run no replica dispatched: the job's only instant is on 29
// February and it allows overlap, so no overlap probe meets the run
// either. A replica process of the fleet takes it over all the same (its
// sweep): attempt 2, a higher fence, succeeded, and run nowhere else.
// Stopped, the trigger says it handed the run back.
func TestAReplicaTakesOverARunATriggerHereLeft(t *testing.T) {
	testenv.WallClock(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(testenv.FastDir(t), "shared.db")
			// The trigger's sleep lasts an hour: it is stopped mid-run.
			// The replica's lasts 100ms.
			conf := func(name, duration string) string {
				return sqliteConfig(t, dir, db, name, `  example.sleep:
    schedule: "0 0 0 29 2 *"
    overlap: allow
    params:
      duration: `+duration+"\n")
			}
			fast := conf("fast", "100ms")
			startReplica(t, dir, fast, "r1")
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(readLog(t, dir, "r1"))
				}
			})

			trig, out, exited := startOperator(t, dir, "trigger", "trigger", "--here", "example.sleep", "--config", conf("slow", "1h"))
			var left event
			waitFor(t, "the trigger to start its run", func() bool {
				for _, e := range readEvents(t, dir, "trigger") {
					if e.Msg == "run started" {
						left = e
						return true
					}
				}
				return false
			})
			_ = trig.Process.Signal(sig)
			<-exited
			if sig == syscall.SIGTERM {
				if got := trig.ProcessState.ExitCode(); got != 1 || !strings.Contains(out.String(), "example.sleep: interrupted") {
					t.Errorf("the stopped trigger exited %d saying %q, want 1 and that it handed the run back interrupted", got, out.String())
				}
			}

			var took event
			waitFor(t, "the replica to take the trigger's run over and finish it", func() bool {
				for _, e := range readEvents(t, dir, "r1") {
					if e.Msg == "run finished" && e.RunID == left.RunID {
						took = e
						return true
					}
				}
				return false
			})
			if took.Status != string(claim.Succeeded) || took.Attempt != 2 || took.Fence <= left.Fence {
				t.Errorf("the replica finished %s %s, attempt %d, fence %d; want succeeded, attempt 2, a fence above the trigger's %d",
					took.RunID, took.Status, took.Attempt, took.Fence, left.Fence)
			}
			if n := startedCount(t, dir, []string{"r1", "trigger"})[left.RunID]; n != 2 {
				t.Errorf("the run started %d times, want twice (the trigger's, then the takeover)", n)
			}
			for _, rec := range history(t, dir, fast) {
				if rec.RunID == left.RunID && (rec.Status != claim.Succeeded || rec.Attempt != 2) {
					t.Errorf("history: %s %s attempt %d, want succeeded as attempt 2", rec.RunID, rec.Status, rec.Attempt)
				}
			}
		})
	}
}

// A `trigger --here` stopped while its Redis server stalls (SIGSTOP) cannot
// hand its run back: it says so, and that the fleet takes the run over once
// its lease lapses, instead of a bare "context canceled". Its hand-back
// waits out the backend's timeouts (seconds), so a second signal ends it at
// once, as it ends a replica (it used to be swallowed: an operator's only
// way out was kill -9).
func TestATriggerStoppedWhileItsBackendStallsSaysWhatItLeft(t *testing.T) {
	srv := testenv.StartRedis(t)
	dir := t.TempDir()
	body := leapDayConfig(`  kind: redis
  lease: 3s
  renew_every: 500ms
  redis:
    addr: `+srv.Addr()+"\n", "1h")
	config := writeConfig(t, dir, body)
	// A server up for less than a lease looks like one that restarted
	// empty, and holds every run for a lease: a trigger says so, not that
	// another replica holds its run. (A lease of 30s: the server is surely
	// younger.)
	fresh := writeConfig(t, t.TempDir(), strings.Replace(strings.Replace(body, "lease: 3s", "lease: 30s", 1), "duration: 1h", "duration: 10ms", 1))
	if r := run(t, dir, "trigger", "--here", "example.sleep", "--config", fresh); r.code != 1 ||
		!strings.Contains(r.stderr, "lost its data or just restarted") || strings.Contains(r.stderr, "another replica") {
		t.Errorf("trigger on a server just started: exit %d\n%s\nwant 1, saying the server holds every run for a lease", r.code, r.stderr)
	}
	waitFor(t, "the server to be up for a lease", func() bool {
		out, err := exec.Command("redis-cli", "-p", strconv.Itoa(srv.Port()), "info", "server").Output()
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(out, []byte("uptime_in_seconds:"))
		up, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(out[i+len("uptime_in_seconds:"):]), "\n", 2)[0]))
		return up >= 4
	})
	started := func(name string) bool {
		return slices.ContainsFunc(readEvents(t, dir, name), func(e event) bool { return e.Msg == "run started" })
	}
	once, onceOut, onceExited := startOperator(t, dir, "once", "trigger", "--here", "example.sleep", "--config", config)
	twice, _, twiceExited := startOperator(t, dir, "twice", "trigger", "--here", "example.sleep", "--config", config)
	waitFor(t, "both triggers to start their runs", func() bool { return started("once") && started("twice") })

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	for _, p := range []*exec.Cmd{once, twice} {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	waitFor(t, "the trigger to say it is stopping", func() bool {
		return strings.Contains(readLog(t, dir, "twice"), "a second signal exits at once")
	})
	select {
	case <-twiceExited:
		t.Fatal("the trigger exited before its hand-back had waited on the stalled server; the second signal proves nothing")
	default:
	}
	_ = twice.Process.Signal(syscall.SIGTERM)
	select {
	case <-twiceExited:
	case <-time.After(5 * time.Second):
		t.Fatal("the second SIGTERM did not end the trigger")
	}
	if ws, ok := twice.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("the trigger signalled twice ended %v, want killed by the second SIGTERM", twice.ProcessState)
	}

	select {
	case <-onceExited:
	case <-time.After(60 * time.Second):
		t.Fatal("the trigger stopped once did not exit")
	}
	stderr := readLog(t, dir, "once")
	if code := once.ProcessState.ExitCode(); code != 1 ||
		!strings.Contains(onceOut.String(), "example.sleep: lease_lost") ||
		!strings.Contains(stderr, "the hand-back was not confirmed") || strings.Contains(stderr, "context canceled") {
		t.Errorf("the trigger stopped once exited %d, printing %q and\n%s\nwant 1, its run's lease lost and that the fleet takes it over", code, onceOut.String(), stderr)
	}
}

// A `trigger --here` stopped while its claim waits on the backend (the
// runs table locked by another transaction), and a backfill stopped while
// its history read waits, say that nothing ran, not "context canceled",
// and exit 1.
func TestOperatorCommandsStoppedBeforeTheirGrantSayNothingRan(t *testing.T) {
	dsn := pgSchema(t)
	dir := t.TempDir()
	configFor := func(app string) string {
		return writeConfig(t, t.TempDir(), leapDayConfig(`  kind: postgres
  lease: 30s
  renew_every: 5s
  postgres:
    dsn: "`+dsn+"&application_name="+app+"\"\n", "10ms"))
	}
	if r := run(t, dir, "migrate", "up", "--config", configFor("migrate")); r.code != 0 {
		t.Fatalf("migrate up: exit %d\n%s", r.code, r.stderr)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), "LOCK TABLE scheduler_runs IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	// Watched from outside the transaction: within it, pg_stat_activity is
	// read once and kept.
	watch, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	for _, c := range []struct {
		name, said string
		args       []string
	}{
		{"trigger", "stopped before the run was granted: nothing ran here", []string{"trigger", "--here", "example.sleep"}},
		{"backfill", "stopped before it claimed anything: nothing ran", []string{"backfill", "--from", "2024-02-29", "--to", "2024-02-29", "example.sleep"}},
	} {
		p, out, exited := startOperator(t, dir, c.name, append(c.args, "--config", configFor(c.name))...)
		waitFor(t, "the "+c.name+" to wait for the lock", func() bool {
			var n int
			if err := watch.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
				WHERE NOT l.granted AND l.relation = 'scheduler_runs'::regclass AND a.application_name = $1`, c.name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		})
		_ = p.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("the stopped %s did not exit", c.name)
		}
		stderr := readLog(t, dir, c.name)
		if code := p.ProcessState.ExitCode(); code != 1 ||
			!strings.Contains(stderr, c.said) || strings.Contains(stderr, "context canceled") {
			t.Errorf("the %s stopped as it waited exited %d, printing %q and\n%s\nwant 1 and %q", c.name, code, out.String(), stderr, c.said)
		}
		if slices.ContainsFunc(readEvents(t, dir, c.name), func(e event) bool { return e.Msg == "run started" }) {
			t.Errorf("the stopped %s started a run", c.name)
		}
	}
}

// A `trigger --wait` stopped while it waits holds no run: the fleet runs
// the request. It says so, and how to wait again without a second run,
// not that runs in flight are handed back (it said that, and ended with
// a bare "context canceled": an outside review, whose run then
// succeeded on a replica).
func TestAStoppedTriggerWaitSaysTheRequestStays(t *testing.T) {
	dir := t.TempDir()
	config := writeConfig(t, dir, leapDayConfig("  kind: sqlite\n  sqlite:\n    path: "+filepath.Join(dir, "claims.db")+"\n", "10ms"))
	if r := run(t, dir, "migrate", "up", "--config", config); r.code != 0 {
		t.Fatalf("migrate up: exit %d\n%s", r.code, r.stderr)
	}
	// Its stdout to a file, read while it runs (startOperator's buffer is
	// read only once the process has exited).
	stdout, err := os.Create(filepath.Join(dir, "waiting.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	lf, err := os.Create(filepath.Join(dir, "waiting.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	p := exec.Command(binary, "trigger", "--wait", "--request-id", "k-stop", "--config", config, "example.sleep")
	p.Dir, p.Stdout, p.Stderr = dir, stdout, lf
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = p.Wait(); close(exited) }()
	t.Cleanup(func() { _ = p.Process.Kill(); <-exited })
	waitFor(t, "the trigger to make its request", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "waiting.out"))
		return err == nil && strings.Contains(string(b), "(request k-stop)")
	})
	_ = p.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the stopped trigger did not exit")
	}
	stderr := readLog(t, dir, "waiting")
	again := "scheduler trigger --config " + config + " --request-id k-stop --wait example.sleep"
	if code := p.ProcessState.ExitCode(); code != 1 || strings.Contains(stderr, "handed back") || strings.Contains(stderr, "context canceled") ||
		!strings.Contains(stderr, "request k-stop stays queued") || !strings.Contains(stderr, again) {
		t.Fatalf("the stopped trigger --wait exited %d with\n%s\nwant 1, the request said to stay queued, and %q", code, stderr, again)
	}
	// The command it suggests, pasted anywhere, finds the request (and
	// waits a second for it: no replica runs it here).
	if r := run(t, t.TempDir(), append(strings.Fields(again)[1:], "--timeout", "1s")...); !strings.Contains(r.stdout, "request k-stop already made") {
		t.Errorf("the suggested command, from another directory: exit %d\n%s%s\nwant the request found already made", r.code, r.stdout, r.stderr)
	}
}

// leapDayConfig is an operator's configuration on the claimer block given:
// example.sleep, sleeping duration, falls due on 29 February only (no
// replica's schedule meets its manual runs) and allows overlap.
func leapDayConfig(claimer, duration string) string {
	return "instance_id: operator\nclaimer:\n" + claimer + `http:
  addr: ""
log:
  format: json
jobs:
  example.sleep:
    schedule: "0 0 0 29 2 *"
    overlap: allow
    params:
      duration: ` + duration + "\n"
}
