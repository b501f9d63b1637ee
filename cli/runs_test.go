package cli_test

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/schedule"
)

// `scheduler runs` shows a run's failed attempts, its retry pending and
// its start under jitter: in the JSON always, in the table as a note, and
// one line per failed attempt with --attempts.
func TestRunsShowAttemptsRetriesAndJitter(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n    jitter: 1h\n"+
		"    retry: {max_attempts: 3, backoff: 30s}\n")
	ctx := t.Context()
	ctl := control.New(b.Controls, nil)
	now := time.Now().UTC()
	day := now.Truncate(24 * time.Hour)
	// Yesterday's run failed for good; today's failed its first attempt,
	// which left the record running, and retries later.
	ended := claim.Run{Job: "example.sleep", At: day.Add(-24 * time.Hour)}
	pending := claim.Run{Job: "example.sleep", At: day}
	retryAt := now.Add(time.Hour).Truncate(time.Second) // past the lease
	for _, x := range []struct {
		run     claim.Run
		err     string
		retryAt time.Time
	}{{ended, "disk full\ttoo", time.Time{}}, {pending, "boom", retryAt}} {
		cl, err := claim.ClaimOne(ctx, b, x.run, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := ctl.RecordAttempt(ctx, control.Attempt{RunID: cl.ID(), Attempt: cl.Attempt, Fence: cl.Fence, Holder: "replica-a",
			Status: claim.Failed, Error: x.err, Started: now.Add(-2 * time.Second), Ended: now, RetryAt: x.retryAt}); err != nil {
			t.Fatal(err)
		}
		if x.retryAt.IsZero() {
			if err := claim.ReleaseOne(ctx, b, cl, claim.Failed); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := mainIn(t, dir, "runs", "--json", "--config", path)
	if code != cli.ExitOK {
		t.Fatalf("runs --json: exit %d: %s", code, errOut)
	}
	var runs []struct {
		RunID        string            `json:"run_id"`
		Status       claim.Status      `json:"status"`
		Attempt      int               `json:"attempt"`
		MaxAttempts  int               `json:"max_attempts"`
		StartsAt     *time.Time        `json:"starts_at"`
		Attempts     []control.Attempt `json:"attempts"`
		RetryPending *struct {
			Attempt int       `json:"attempt"`
			At      time.Time `json:"at"`
		} `json:"retry_pending"`
	}
	if err := json.Unmarshal([]byte(out), &runs); err != nil {
		t.Fatalf("%v in\n%s", err, out)
	}
	s, err := schedule.Parse("@daily", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].RunID != pending.ID() || runs[1].RunID != ended.ID() {
		t.Fatalf("runs --json:\n%s", out)
	}
	p, f := runs[0], runs[1]
	if p.Status != claim.Running || p.Attempt != 1 || p.MaxAttempts != 3 || p.RetryPending == nil ||
		p.RetryPending.Attempt != 2 || !p.RetryPending.At.Equal(retryAt) ||
		len(p.Attempts) != 1 || p.Attempts[0].Error != "boom" || !p.Attempts[0].RetryAt.Equal(retryAt) ||
		p.StartsAt == nil || !p.StartsAt.Equal(s.Jittered("example.sleep", day, time.Hour)) {
		t.Fatalf("the run retrying:\n%s", out)
	}
	if f.Status != claim.Failed || f.RetryPending != nil || len(f.Attempts) != 1 || !f.Attempts[0].RetryAt.IsZero() {
		t.Fatalf("the run that ended failed:\n%s", out)
	}

	code, out, errOut = mainIn(t, dir, "runs", "--config", path)
	if code != cli.ExitOK {
		t.Fatalf("runs: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], "NOTE") ||
		!strings.Contains(lines[1], " 1/3 ") ||
		!strings.Contains(lines[1], "retry 2/3 at "+retryAt.Format(time.RFC3339)+"; starts +") ||
		!strings.HasSuffix(lines[1], " (jitter); 1 failed attempt (--attempts)") ||
		strings.Contains(lines[2], "retry 2/3") || !strings.HasSuffix(lines[2], "; 1 failed attempt (--attempts)") {
		t.Fatalf("runs:\n%s", out)
	}

	code, out, errOut = mainIn(t, dir, "runs", "--attempts", "--config", path)
	if code != cli.ExitOK {
		t.Fatalf("runs --attempts: exit %d: %s", code, errOut)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || strings.Contains(out, "(--attempts)") ||
		!strings.HasPrefix(lines[2], "  ↳ ") || !strings.Contains(lines[2], " failed ") ||
		!strings.HasSuffix(lines[2], "retry due "+retryAt.Format(time.RFC3339)+"; error: boom") ||
		!strings.HasPrefix(lines[4], "  ↳ ") || !strings.HasSuffix(lines[4], " error: disk full too") {
		t.Fatalf("runs --attempts:\n%s", out)
	}
	// The columns line up: every line's STATUS starts where the header's does.
	col := strings.Index(lines[0], "STATUS")
	for _, l := range lines[1:] {
		if r := []rune(l); len(r) <= col || r[col-1] != ' ' || r[col] == ' ' {
			t.Fatalf("misaligned STATUS column at %d:\n%s", col, out)
		}
	}
}

// sqliteBackend writes config.yaml, on an SQLite file beside it, with
// the given jobs block, in a fresh directory, and opens its backend
// (migrated) as the replica "replica-a", for the test to write history
// the CLI then reads; the caller closes it.
func sqliteBackend(t *testing.T, jobsYAML string) (dir, path string, b *claimers.Backend) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte("claimer:\n  kind: sqlite\n  sqlite:\n    path: "+filepath.Join(dir, "claims.db")+"\n"+
		"http:\n  addr: \"\"\nlog:\n  level: error\njobs:\n"+jobsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err = claimers.Open(t.Context(), cfg.Claimer, "replica-a", claimers.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	return dir, path, b
}

// The commands that read the fleet's state or write to the fleet, on a
// SQLite path that names no file, say so and exit 1, and leave no file
// behind: opening it would have created one, migrated and empty, that
// replicas started later would join with their fences starting over, and
// a pause or a run requested there would reach no replica.
func TestReadingAMissingSQLiteFileCreatesNone(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "gone.db")
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("claimer:\n  kind: sqlite\n  sqlite:\n    path: "+db+"\nhttp:\n  addr: \"\"\n"+
		"jobs:\n  example.sleep:\n    schedule: \"@daily\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// jobs lists the schedule: with no file, nothing is paused.
	if code, out, errOut := mainIn(t, dir, "jobs", "--config", cfg); code != cli.ExitOK || !strings.Contains(out, "example.sleep") ||
		!strings.Contains(errOut, "no database at "+db) {
		t.Errorf("jobs on a missing file: exit %d, stdout %q, stderr %q; want 0, the job, and a note naming the path", code, out, errOut)
	}
	if _, err := os.Stat(db); err == nil {
		t.Fatalf("jobs created %s", db)
	}
	for _, args := range [][]string{{"runs"}, {"prune", "--older-than", "720h"}, {"pause", "example.sleep"}, {"resume", "example.sleep"},
		{"trigger", "example.sleep"}, {"migrate", "status"}, {"migrate", "down"}} {
		code, _, errOut := mainIn(t, dir, append(args, "--config", cfg)...)
		if code != cli.ExitRuntime || !strings.Contains(errOut, "no database at "+db) {
			t.Errorf("%s on a missing file: exit %d, stderr %q; want 1 naming the path", args[0], code, errOut)
		}
		if _, err := os.Stat(db); err == nil {
			t.Fatalf("%s created %s", args[0], db)
		}
	}
}

// A manual run's instant is its request time, in the second of a
// scheduled instant it may share: the table shows it to the nanosecond,
// so the two never read as one run recorded twice. Found by an outside
// review.
func TestRunsTellsAManualRunFromTheScheduledRunOfItsSecond(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	day := time.Now().UTC().Truncate(24 * time.Hour)
	scheduled := claim.Run{Job: "example.sleep", At: day}
	manual := claim.Run{Job: "example.sleep", At: day.Add(592 * time.Millisecond)}
	for _, run := range []claim.Run{scheduled, manual} {
		cl, err := claim.ClaimOne(t.Context(), b, run, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.ReleaseOne(t.Context(), b, cl, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := mainIn(t, dir, "runs", "--config", path)
	if code != cli.ExitOK {
		t.Fatalf("runs: exit %d: %s", code, errOut)
	}
	second := day.Format("2006-01-02T15:04:05")
	if !strings.Contains(out, second+"Z ") || !strings.Contains(out, second+".592Z ") {
		t.Fatalf("runs does not tell the two runs of %s apart:\n%s", second, out)
	}
}

// The commands that read or write the fleet's state, against a
// PostgreSQL server that does not answer, say so first and exit 1: they
// said "migration status" first, which sent an operator to the schema
// (found by an outside review). The password stays out.
func TestCommandsOnADatabaseThatDoesNotAnswerSaySo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("claimer:\n  kind: postgres\n  postgres:\n    dsn: postgres://app:s3cr3t-pw@"+addr+"/db?connect_timeout=5\n"+
		"http:\n  addr: \"\"\njobs:\n  example.sleep:\n    schedule: \"@daily\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"runs"}, {"pause", "example.sleep"}, {"prune", "--older-than", "720h"}} {
		code, _, errOut := mainIn(t, dir, append(args, "--config", cfg)...)
		if code != cli.ExitRuntime || !strings.Contains(errOut, "the database does not answer") || !strings.Contains(errOut, addr) ||
			strings.Contains(errOut, "migration status") || strings.Contains(errOut, "s3cr3t-pw") {
			t.Errorf("%s on a server that does not answer: exit %d, stderr %q; want 1, saying the database does not answer at %s",
				args[0], code, errOut, addr)
		}
	}
}

// A pause's note may hold a line break and a tab (a multi-line note is
// allowed): `jobs` shows it quoted, one line a job, its columns whole.
// It once wrapped the NEXT column onto a line of its own (an outside
// review).
func TestJobsShowsAMultiLineNoteOnOneLine(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := mainIn(t, dir, "pause", "example.sleep", "--note", "disk full\n\tsee ticket 7", "--config", path); code != cli.ExitOK {
		t.Fatalf("pause with a two-line note: exit %d, %s", code, errOut)
	}
	code, out, errOut := mainIn(t, dir, "jobs", "--config", path)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != cli.ExitOK || len(lines) != 2 || !strings.Contains(lines[1], `"disk full\n\tsee ticket 7"`) || !strings.HasSuffix(lines[1], "Z") {
		t.Fatalf("jobs: exit %d, stderr %q, stdout:\n%s\nwant a header and one line a job, the note quoted", code, errOut, out)
	}
}

// runs --job names a job of the configuration or one with recorded runs
// (a removed job's history is still shown); a name with neither is a
// typo, exit 2, as pause and trigger answer it.
func TestRunsOfAnUnknownJobIsAUsageError(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	ctx := t.Context()
	cl, err := claim.ClaimOne(ctx, b, claim.Run{Job: "removed.job", At: time.Now().UTC().Truncate(time.Second)}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := claim.ReleaseOne(ctx, b, cl, claim.Succeeded); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := mainIn(t, dir, "runs", "--job", "no.such", "--config", path); code != cli.ExitUsage || out != "" || !strings.Contains(errOut, `--job "no.such": no such job`) {
		t.Errorf("runs --job no.such: exit %d, stdout %q, stderr %q; want %d naming it", code, out, errOut, cli.ExitUsage)
	}
	if code, out, errOut := mainIn(t, dir, "runs", "--job", "removed.job", "--config", path); code != cli.ExitOK || !strings.Contains(out, "removed.job") {
		t.Errorf("runs --job removed.job (recorded, not configured): exit %d, stdout %q, stderr %q; want its run", code, out, errOut)
	}
	if code, _, errOut := mainIn(t, dir, "runs", "--job", "example.sleep", "--config", path); code != cli.ExitOK {
		t.Errorf("runs --job example.sleep (configured, never ran): exit %d, stderr %q; want 0", code, errOut)
	}
}
