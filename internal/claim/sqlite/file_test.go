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
		// alone: no replica opens the path in this process after the swap.
		// SQLite shares one -shm mapping between the connections of a
		// process to one file, so one opened here would find the old one
		// (the test through the binary opens it in a process of its own).
		alone bool
	}{
		{"deleted", "was deleted since", func(t *testing.T, path string) {
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Fatal(err)
				}
			}
		}, false},
		// The latest commits live in the -wal until a checkpoint: a new
		// process would see the file without them, and its -shm apart
		// from the old processes' would corrupt the file.
		{"wal and shm deleted", "-wal was deleted", func(t *testing.T, path string) {
			for _, suffix := range []string{"-wal", "-shm"} {
				if err := os.Remove(path + suffix); err != nil {
					t.Fatal(err)
				}
			}
		}, true},
		{"shm deleted", "-shm was deleted", func(t *testing.T, path string) {
			if err := os.Remove(path + "-shm"); err != nil {
				t.Fatal(err)
			}
		}, true},
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
		}, false},
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
			next := claim.Run{Job: "job.file", At: at.Add(time.Minute)}
			var now *Claimer
			if !tc.alone {
				// A replica started now opens (or creates) the file at path.
				if now, err = Open(ctx, path, Options{Instance: "new"}); err != nil {
					t.Fatal(err)
				}
				defer now.Close()
				if _, err := claim.ClaimOne(ctx, now, next, time.Minute); err != nil {
					t.Fatalf("the replica on the file now at the path: %v", err)
				}
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
			select {
			case <-old.Lost():
			default:
				t.Fatal("Lost is not closed")
			}
			if now == nil {
				return
			}
			if err := now.Ping(ctx); err != nil {
				t.Fatalf("readiness on the file now at the path: %v", err)
			}
			select {
			case <-now.Lost():
				t.Fatal("Lost is closed for the replica on the file now at the path")
			default:
			}
		})
	}
}

// TestARelativePathInARenamedDirectory: the default path is relative
// (./scheduler.db). A replica's working directory renamed away, and a new
// replica started in a new directory under the old name, named two files
// by one path: each kept a ledger (found by an outside review). The path
// is made absolute at Open, so the first replica sees the file gone.
func TestARelativePathInARenamedDirectory(t *testing.T) {
	ctx := t.Context()
	root := t.TempDir()
	app := filepath.Join(root, "app")
	if err := os.Mkdir(app, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(app)
	old, err := Open(ctx, "scheduler.db", Options{Instance: "old"})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := os.Rename(app, filepath.Join(root, "app.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(app, 0o755); err != nil {
		t.Fatal(err)
	}
	now, err := Open(ctx, filepath.Join(app, "scheduler.db"), Options{Instance: "new"})
	if err != nil {
		t.Fatal(err)
	}
	defer now.Close()
	if _, err := claim.ClaimOne(ctx, now, claim.Run{Job: "job.rel", At: at}, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err = claim.ClaimOne(ctx, old, claim.Run{Job: "job.rel", At: at}, time.Minute)
	if !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), filepath.Join(app, "scheduler.db")) {
		t.Fatalf("claim through the renamed directory: %v, want ErrUnavailable naming the absolute path", err)
	}
}

// TestAFileWrittenOverGoesBackInTime: a backup copied over the live file
// in place keeps the file's identity, and takes the ledger back to the
// backup: the runs since are forgotten, and the fence counter starts
// again below fences already granted (found by an outside review: a run
// executed twice, fence 7 handed out after 15). The first grant not above
// every earlier one makes the replica stop claiming. The copy is played
// here by taking the ledger back in SQL: a copy in place within one
// process leaves SQLite's locks and caches in a state no replica's
// process would see.
func TestAFileWrittenOverGoesBackInTime(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "live.db")
	c, err := Open(ctx, path, Options{Instance: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	claimAt := func(i int) (*claim.Claim, error) {
		return claim.ClaimOne(ctx, c, claim.Run{Job: "job.back", At: at.Add(time.Duration(i) * time.Minute)}, time.Minute)
	}
	first, err := claimAt(0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := claimAt(i); err != nil {
			t.Fatal(err)
		}
	}
	// A replica that won none of those grants, only lost a bid after them.
	d, err := Open(ctx, path, Options{Instance: "d"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := claim.ClaimOne(ctx, d, claim.Run{Job: "job.back", At: at.Add(3 * time.Minute)}, time.Minute); !errors.Is(err, claim.ErrHeld) {
		t.Fatalf("a bid for a held run: %v, want ErrHeld", err)
	}
	// Back to the backup taken after the first claim.
	if _, err := c.db.ExecContext(ctx, `DELETE FROM scheduler_runs WHERE fence > ?`, first.Fence); err != nil {
		t.Fatal(err)
	}
	if _, err := c.db.ExecContext(ctx, `UPDATE scheduler_fence SET value = ? WHERE id = 1`, first.Fence); err != nil {
		t.Fatal(err)
	}
	// Runs 1 to 3 are forgotten; run 1 is granted again, below run 3's
	// fence.
	cl, err := claimAt(1)
	if !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), "went back in time") {
		t.Fatalf("the first claim after the restore: %v (%+v), want ErrUnavailable saying the file went back in time", err, cl)
	}
	// A batch, too.
	_, errs := c.Claim(ctx, []claim.Run{{Job: "job.back", At: at.Add(5 * time.Minute)}, {Job: "job.back", At: at.Add(6 * time.Minute)}}, time.Minute)
	for _, err := range errs {
		if !errors.Is(err, claim.ErrUnavailable) {
			t.Fatalf("a batch after that: %v, want ErrUnavailable", err)
		}
	}
	if err := c.Ping(ctx); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("readiness after that: %v, want ErrUnavailable", err)
	}
	select {
	case <-c.Lost():
	default:
		t.Fatal("Lost is not closed")
	}
	// The other replica sees it at its next bid, which reads the counter
	// (found by an outside review: only the replica that had been granted
	// the higher fences stopped, and the others ran a run again).
	_, err = claim.ClaimOne(ctx, d, claim.Run{Job: "job.back", At: at.Add(7 * time.Minute)}, time.Minute)
	if !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), "went back in time") {
		t.Fatalf("the other replica's next bid: %v, want ErrUnavailable saying the file went back in time", err)
	}
}

// TestALinkToTheFileIsFollowed: SQLite keeps the -wal and -shm beside the
// file a symbolic link names. A path that is a link must open and claim
// (found by an outside review: it never started), and a link retargeted
// later is a replaced file.
func TestALinkToTheFileIsFollowed(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	real := filepath.Join(dir, "real.db")
	link := filepath.Join(dir, "link.db")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	c, err := Open(ctx, link, Options{Instance: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := claim.ClaimOne(ctx, c, claim.Run{Job: "job.link", At: at}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other.db")
	o, err := Open(ctx, other, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("readiness through a retargeted link: %v, want ErrUnavailable saying the file was replaced", err)
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
	c := withReadOnlyConnection(t)
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

// TestReadinessReportsARefusedClaim: a probe that rewrites one row can
// pass where claims fail (a full disk, whose log still has room for a
// page: found by an outside review), so readiness reports the file's last
// refusal of a claim until a claim succeeds. A read-only connection plays
// the refusal here.
func TestReadinessReportsARefusedClaim(t *testing.T) {
	ctx := t.Context()
	c := withReadOnlyConnection(t)
	if _, err := claim.ClaimOne(ctx, c, claim.Run{Job: "job.refused", At: at}, time.Minute); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("claim on a read-only connection: %v, want ErrUnavailable", err)
	}
	// The probe would pass now (the connection was replaced): readiness
	// still says what the claim met.
	if err := c.Ping(ctx); !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), "the last write was refused") {
		t.Fatalf("readiness after a refused claim: %v, want ErrUnavailable saying the last write was refused", err)
	}
	if _, err := claim.ClaimOne(ctx, c, claim.Run{Job: "job.refused", At: at.Add(time.Minute)}, time.Minute); err != nil {
		t.Fatalf("claim on a new connection: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("readiness once a claim succeeded: %v", err)
	}
}

// withReadOnlyConnection opens a Claimer on a new file (closed when the
// test ends) whose pool keeps one connection besides the pinned one,
// read-only (query_only), so that every statement gets it.
func withReadOnlyConnection(t *testing.T) *Claimer {
	t.Helper()
	c, err := Open(t.Context(), filepath.Join(t.TempDir(), "ro.db"), Options{Instance: "ro"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	c.db.SetMaxOpenConns(2)
	conn, err := c.db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(t.Context(), "PRAGMA query_only = ON"); err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(); err != nil { // back to the pool, read-only
		t.Fatal(err)
	}
	return c
}
