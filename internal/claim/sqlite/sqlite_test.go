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
	cl, err := claim.ClaimOne(ctx, a, run, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := claim.ClaimOne(ctx, b, run, time.Minute); !errors.Is(err, claim.ErrHeld) {
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
