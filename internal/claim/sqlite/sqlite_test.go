package sqlite_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/sqlite"
)

var base = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

func TestPruneDeletesOnlyFinishedRunsPastRetention(t *testing.T) {
	ctx := t.Context()
	c := sqlite.New(openDB(t, migratedFile(t)), sqlite.Options{Instance: "replica-a"})
	var live *claim.Claim
	for i, o := range []claim.Outcome{claim.Succeeded, claim.Failed, claim.Skipped, claim.Interrupted, ""} {
		cl, err := c.Claim(ctx, claim.Run{Job: "job.prune", At: base.Add(time.Duration(i) * time.Second)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if o == "" {
			live = cl
			continue
		}
		if err := c.Release(ctx, cl, o); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := c.Prune(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("prune older than 1h = %d, %v; want 0 (nothing is that old)", n, err)
	}
	// SQLite's clock has millisecond resolution: make the releases older
	// than "now" by at least one tick.
	deadline := time.Now().Add(5 * time.Second)
	var pruned int64
	for pruned < 3 && time.Now().Before(deadline) {
		n, err := c.Prune(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		pruned += n
	}
	if pruned != 3 {
		t.Fatalf("prune older than 0 deleted %d runs, want the 3 finished ones", pruned)
	}
	recs, err := c.History(ctx, "job.prune", 0)
	if err != nil || len(recs) != 2 {
		t.Fatalf("history after prune = %+v, %v; want the interrupted and the running run", recs, err)
	}
	if err := c.Renew(ctx, live, time.Minute); err != nil {
		t.Fatalf("live claim after prune: %v", err)
	}
	if _, err := c.Prune(ctx, -time.Second); !errors.Is(err, claim.ErrInvalid) {
		t.Fatalf("negative retention: %v, want ErrInvalid", err)
	}
}

// Open is what `scheduler run` does with no config: create and migrate the
// file, then claim. A second process opening the same file sees the claim.
func TestOpenCreatesAndMigratesTheFile(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "dir with spaces?", "scheduler.db")
	if _, err := sqlite.Open(ctx, path, sqlite.Options{}); err == nil {
		t.Fatal("open in a missing directory succeeded")
	}
	path = filepath.Join(t.TempDir(), "a b?c#d.db")
	a, err := sqlite.Open(ctx, path, sqlite.Options{Instance: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := sqlite.Open(ctx, path, sqlite.Options{Instance: "replica-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	run := claim.Run{Job: "job.open", At: base}
	cl, err := a.Claim(ctx, run, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Claim(ctx, run, time.Minute); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("claim through a second open: %v, want ErrHeld", err)
	}
	if err := a.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if cl.Deadline.Before(cl.Requested.Add(time.Minute).Add(-time.Second)) {
		t.Fatalf("deadline %v is not about a minute after %v", cl.Deadline, cl.Requested)
	}
}

func TestNewPanicsOnNilDB(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New(nil) did not panic")
		}
	}()
	sqlite.New(nil, sqlite.Options{})
}
