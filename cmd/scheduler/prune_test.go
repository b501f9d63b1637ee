package main_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
	"github.com/scheduler-dev/scheduler/migrations"
)

// graceJob keeps a missed run claimable for three days, past prune's 48h floor.
const graceJob = "jobs:\n  example.sleep:\n    schedule: \"@daily\"\n    misfire: {policy: run-once, grace: 72h}\n"

// prune --older-than refuses an age at which a replica could still claim a
// run of some job, naming the flag, the value and the job; and any age under
// the floor, whatever the jobs.
func TestPruneRefusesAnAgeAJobCanStillClaim(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, dir, "http:\n  addr: \"\"\n"+graceJob)
	r := run(t, dir, "prune", "--config", path, "--older-than", "60h")
	if r.code != 2 || !strings.Contains(r.stderr, "--older-than 60h0m0s: must be at least 72h1m4s") ||
		!strings.Contains(r.stderr, "jobs.example.sleep") {
		t.Fatalf("prune --older-than 60h with a 72h grace: %+v", r)
	}
	r = run(t, dir, "prune", "--older-than", "24h") // the built-in config: 1h grace
	if r.code != 2 || !strings.Contains(r.stderr, "--older-than 24h0m0s: must be at least 48h0m0s") {
		t.Fatalf("prune --older-than 24h: %+v", r)
	}
}

// Pruned at the allowed minimum, a run a replica may still claim stays done,
// while a run just past the window is forgotten (and would be granted again).
func TestPruneAtMinRetentionKeepsClaimableRuns(t *testing.T) {
	for _, tc := range []struct {
		kind   string
		config func(c config.Claimer) string // the claimer block reaching the namespace
	}{
		{"sqlite", func(c config.Claimer) string { return "  sqlite:\n    path: " + c.SQLite.Path + "\n" }},
		{"postgres", func(c config.Claimer) string { return "  postgres:\n    dsn: \"" + c.Postgres.DSN + "\"\n" }},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			dir := t.TempDir()
			ns := backends.Prepare(t, tc.kind, backends.Options{})
			writeConfig(t, dir, "claimer:\n  kind: "+tc.kind+"\n"+tc.config(ns.Config)+"http:\n  addr: \"\"\n"+graceJob)
			c := ns.Open("replica-a")
			backdate := backdater(t, c)
			path := filepath.Join(dir, "config.yaml")
			cfg, err := config.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			window, job := cfg.MinRetention()
			if job != "example.sleep" {
				t.Fatalf("MinRetention names %q, want example.sleep", job)
			}

			// kept is the oldest run a replica starting now may still claim:
			// its start-up lookback reaches 72h (the grace) back on a clock
			// max_clock_skew (2s) slow; a replica whose clock runs 2s fast
			// had won it and finished it 2s before its instant; the new bid
			// reaches the backend after its spread hold and claim call
			// (within a lease, 30s).
			now := time.Now().UTC().Truncate(time.Second)
			oldest := now.Add(-72*time.Hour - 2*time.Second - 30*time.Second)
			kept := claim.Run{Job: job, At: oldest.Add(2 * time.Second)}
			gone := claim.Run{Job: job, At: now.Add(-window - time.Hour)}
			for _, x := range []struct {
				run      claim.Run
				finished time.Time
			}{{kept, oldest.Add(-2 * time.Second)}, {gone, now.Add(-window - time.Minute)}} {
				cl, err := claim.ClaimOne(t.Context(), c, x.run, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if err := claim.ReleaseOne(t.Context(), c, cl, claim.Succeeded); err != nil {
					t.Fatal(err)
				}
				backdate(x.run, x.finished)
			}

			if r := run(t, dir, "prune", "--config", path, "--older-than", (window - time.Millisecond).String()); r.code != 2 {
				t.Fatalf("prune just below the window: %+v", r)
			}
			r := run(t, dir, "prune", "--config", path, "--older-than", window.String())
			if r.code != 0 || !strings.Contains(r.stdout, "pruned 1 finished runs") {
				t.Fatalf("prune --older-than %v: %+v", window, r)
			}
			if _, err := claim.ClaimOne(t.Context(), c, kept, time.Minute); !errors.Is(err, claim.ErrDone) {
				t.Fatalf("claim of a run inside the window after prune: %v, want ErrDone", err)
			}
			if cl, err := claim.ClaimOne(t.Context(), c, gone, time.Minute); err != nil || cl.Attempt != 1 {
				t.Fatalf("claim of the pruned run: %+v, %v; want it granted again as attempt 1", cl, err)
			}
		})
	}
}

// backdater returns a way to set a run's finished_at in b's database
// (integer unix ms in SQLite, a timestamptz in PostgreSQL).
func backdater(t *testing.T, b *claimers.Backend) func(claim.Run, time.Time) {
	return func(run claim.Run, finished time.Time) {
		t.Helper()
		var err error
		if b.Dialect == migrations.SQLite {
			_, err = b.DB.ExecContext(t.Context(), "UPDATE scheduler_runs SET finished_at = ? WHERE run_id = ?", finished.UnixMilli(), run.ID())
		} else {
			_, err = b.DB.ExecContext(t.Context(), "UPDATE scheduler_runs SET finished_at = $1 WHERE run_id = $2", finished, run.ID())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
