package main_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// TestPausedHolderLosesItsLeaseAndItsWritesAreFenced freezes the process
// holding a billing run (SIGSTOP) for longer than its lease. Another process
// takes the run over with attempt 2 and a higher fence; when the frozen
// holder resumes (SIGCONT) its handler is cancelled as lease_lost, and no
// invoice is left carrying its stale fence.
func TestPausedHolderLosesItsLeaseAndItsWritesAreFenced(t *testing.T) {
	testenv.WallClock(t)
	dir := t.TempDir()
	dsn := pgSchema(t)
	config := writeConfig(t, dir, `instance_id: ${REPLICA:-admin}
claimer:
  kind: postgres
  postgres:
    dsn: "`+dsn+`"
  lease: 2s
`+replicaSettings+`jobs:
  billing.nightly:
    schedule: "*/10 * * * * *"
    params:
      pace: 40ms
`)
	if r := run(t, dir, "seed", "--config", config, "--customers", "100", "--days", "3"); r.code != 0 {
		t.Fatalf("seed: %+v", r)
	}
	names := []string{"p1", "p2", "p3"}
	procs := map[string]*proc{}
	for _, n := range names {
		procs[n] = startReplica(t, dir, config, n)
	}
	var holder string
	var first event
	t.Cleanup(func() {
		if t.Failed() {
			dumpRuns(t, dir, names, first.RunID)
		}
	})
	waitFor(t, "a billing run in flight", func() bool {
		for _, n := range names {
			if e, ok := openRun(t, dir, n); ok {
				holder, first = n, e
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second) // let it write a few invoices
	_ = procs[holder].cmd.Process.Signal(syscall.SIGSTOP)
	frozen := time.Now()

	var second event
	waitFor(t, "a takeover of the frozen run", func() bool {
		for _, e := range readEvents(t, dir, names...) {
			if e.Msg == "run started" && e.RunID == first.RunID && e.Instance != holder {
				second = e
				return true
			}
		}
		return false
	})
	if second.Attempt != 2 || second.Fence <= first.Fence {
		t.Fatalf("takeover %+v after %+v: want attempt 2 and a higher fence", second, first)
	}
	// Let the successor overtake the frozen holder's position, then wake it.
	time.Sleep(time.Until(frozen.Add(4500 * time.Millisecond)))
	_ = procs[holder].cmd.Process.Signal(syscall.SIGCONT)

	var stale event
	waitFor(t, "the woken holder to finish", func() bool {
		for _, e := range readEvents(t, dir, holder) {
			if e.Msg == "run finished" && e.RunID == first.RunID {
				stale = e
				return true
			}
		}
		return false
	})
	if stale.Status != "lease_lost" {
		t.Fatalf("woken holder finished %q, want lease_lost", stale.Status)
	}
	waitFor(t, "the successor to succeed", func() bool {
		for _, e := range readEvents(t, dir, second.Instance) {
			if e.Msg == "run finished" && e.RunID == first.RunID {
				return e.Status == "succeeded"
			}
		}
		return false
	})
	for _, n := range names {
		_ = procs[n].cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, n := range names {
		<-procs[n].done
	}

	at, err := time.Parse(time.RFC3339, first.ScheduledAt)
	if err != nil {
		t.Fatal(err)
	}
	day := at.UTC().Truncate(24*time.Hour).AddDate(0, 0, -1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n, stalest int64
	if err := conn.QueryRow(ctx, `SELECT count(*), coalesce(min(fence), 0) FROM billing_invoices WHERE period_start = $1`, day).Scan(&n, &stalest); err != nil {
		t.Fatal(err)
	}
	if n != 100 || stalest < second.Fence {
		t.Fatalf("invoices for %s: %d, lowest fence %d; want 100, none below the successor's fence %d", day.Format("2006-01-02"), n, stalest, second.Fence)
	}
	var summary string
	for _, l := range strings.Split(readLog(t, dir, holder), "\n") {
		if strings.Contains(l, "billing summary") && strings.Contains(l, first.RunID) {
			summary = l
		}
	}
	t.Logf("frozen holder %s (fence %d) → successor %s (fence %d); holder's summary: %s", holder, first.Fence, second.Instance, second.Fence, summary)
}
