package sqlite

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

var at = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// TestAFileDeletedOrReplacedIsNotClaimedOn: replicas coordinate through one
// file. A replica that opened a file since deleted or replaced would keep a
// ledger apart from the replicas that open the path now, and every run
// would execute once in each; it refuses to claim, and says why, instead.
func TestAFileDeletedOrReplacedIsNotClaimedOn(t *testing.T) {
	for _, tc := range []struct {
		name, says string
		swap       func(t *testing.T, path string)
	}{
		{"deleted", "was deleted since", func(t *testing.T, path string) {
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Fatal(err)
				}
			}
		}},
		{"replaced", "was deleted or replaced", func(t *testing.T, path string) {
			other := filepath.Join(t.TempDir(), "other.db")
			o, err := Open(t.Context(), other, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := o.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "scheduler.db")
			old, err := Open(ctx, path, Options{Instance: "old"})
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			held, err := claim.ClaimOne(ctx, old, claim.Run{Job: "job.file", At: at}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			tc.swap(t, path)
			// The first write after the swap sees it (here readiness), and
			// what it saw stands: connections opened since may be on
			// another file.
			if err := old.Ping(ctx); !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("readiness on the old file: %v, want ErrUnavailable saying it %s", err, tc.says)
			}
			// A replica started now opens (or creates) the file at path.
			now, err := Open(ctx, path, Options{Instance: "new"})
			if err != nil {
				t.Fatal(err)
			}
			defer now.Close()
			next := claim.Run{Job: "job.file", At: at.Add(time.Minute)}
			if _, err := claim.ClaimOne(ctx, now, next, time.Minute); err != nil {
				t.Fatalf("the replica on the file now at the path: %v", err)
			}

			_, err = claim.ClaimOne(ctx, old, claim.Run{Job: "job.file", At: at.Add(2 * time.Minute)}, time.Minute)
			if !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("claim on the old file: %v, want ErrUnavailable naming %s and saying it %s", err, path, tc.says)
			}
			// A batch, whose reads come before any write, refuses too.
			_, errs := old.Claim(ctx, []claim.Run{next, {Job: "job.file", At: at.Add(3 * time.Minute)}}, time.Minute)
			for _, err := range errs {
				if !errors.Is(err, claim.ErrUnavailable) {
					t.Fatalf("batch claim on the old file: %v, want ErrUnavailable", err)
				}
			}
			if err := old.Renew(ctx, held, time.Minute); !errors.Is(err, claim.ErrUnavailable) {
				t.Fatalf("renew on the old file: %v, want ErrUnavailable", err)
			}
			if err := old.Ping(ctx); !errors.Is(err, claim.ErrUnavailable) {
				t.Fatalf("readiness on the old file: %v, want ErrUnavailable", err)
			}
			if err := now.Ping(ctx); err != nil {
				t.Fatalf("readiness on the file now at the path: %v", err)
			}
		})
	}
}

// TestAReadOnlyConnectionIsNotKept: SQLite opens a file it may not write
// read-only, without a word, and the connection stays read-only for its
// life, long after the file can be written again. query_only stands in for
// that here: the tests run as root, whom file modes do not stop. The write
// that finds such a connection fails, readiness with it, and the next one
// is made on a new connection.
func TestAReadOnlyConnectionIsNotKept(t *testing.T) {
	ctx := t.Context()
	c, err := Open(ctx, filepath.Join(t.TempDir(), "ro.db"), Options{Instance: "ro"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.db.SetMaxOpenConns(1) // so that every statement gets the read-only connection
	conn, err := c.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "PRAGMA query_only = ON"); err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(); err != nil { // back to the pool, read-only
		t.Fatal(err)
	}
	if err := c.Ping(ctx); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("readiness on a read-only connection: %v, want ErrUnavailable", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("readiness after a read-only connection failed once: %v", err)
	}
	if _, err := claim.ClaimOne(ctx, c, claim.Run{Job: "job.ro", At: at}, time.Minute); err != nil {
		t.Fatalf("claim after a read-only connection failed once: %v", err)
	}
}

// TestAFileSwappedDuringOpenIsOpenedAgain: a replica that opens the file
// while another process deletes it and a third creates it anew must end
// on one file, the one the path names, not with connections on the
// deleted file and the new file's identity (what the process test of a
// deleted file found: that replica claimed in the deleted file, beside
// the fleet, and never noticed).
func TestAFileSwappedDuringOpenIsOpenedAgain(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "swap.db")
	first, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	swapped := false
	afterMigrate = func() {
		if swapped {
			return
		}
		swapped = true
		for _, suffix := range []string{"", "-wal", "-shm"} {
			if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Error(err)
			}
		}
		other, err := Open(ctx, path, Options{})
		if err != nil {
			t.Error(err)
			return
		}
		if err := other.Close(); err != nil {
			t.Error(err)
		}
	}
	defer func() { afterMigrate = nil }()
	c, err := Open(ctx, path, Options{Instance: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !swapped {
		t.Fatal("the file was not swapped during the open")
	}
	run := claim.Run{Job: "job.swap", At: at}
	if _, err := claim.ClaimOne(ctx, c, run, time.Minute); err != nil {
		t.Fatal(err)
	}
	d, err := Open(ctx, path, Options{Instance: "d"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := claim.ClaimOne(ctx, d, run, time.Minute); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("a claim on the file the path names: %v, want ErrHeld (the first claim went to another file)", err)
	}
}
