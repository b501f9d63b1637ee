package explore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// smallDisk mounts a small tmpfs of its own for t (root only; "" where the
// mount is not permitted: the refuse class is then not drawn) and returns
// its directory.
func smallDisk(t *testing.T) string {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64m,mode=0755"); err != nil {
		t.Logf("no small disk for the refuse class (mount tmpfs: %v)", err)
		return ""
	}
	// Registered after TempDir's removal, so run before it.
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fullDisk fills the file system at dir (smallDisk's) and empties it
// again, as a disk that filled up and was then cleared, for the SQLite
// file at db. Before filling, the write-ahead log is checkpointed and
// truncated: on a full disk SQLite still writes where its log already has
// room (an outside review saw a probe fit where claims did not), and a
// log emptied first has none, so every write is refused.
func fullDisk(dir string, db *sql.DB) func(ctx context.Context, on bool) error {
	filler := filepath.Join(dir, "filler")
	return func(ctx context.Context, on bool) error {
		if !on {
			if err := os.Remove(filler); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		}
		// A replica's read may keep the log from being truncated: try
		// again a few times, then fill anyway (writes then fail once the
		// log's room is used).
		for range 20 {
			var busy, logged, done int
			if err := db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &logged, &done); err != nil {
				return fmt.Errorf("checkpoint: %w", err)
			}
			if busy == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if free := int64(st.Bavail) * st.Bsize; free > 0 {
			if err := syscall.Fallocate(int(f.Fd()), 0, fi.Size(), free); err != nil && !errors.Is(err, syscall.ENOSPC) {
				return fmt.Errorf("fill: %w", err)
			}
		}
		// Whatever the allocation left (another file grew meanwhile).
		block := make([]byte, 4096)
		for {
			if _, err := f.Write(block); err != nil {
				if errors.Is(err, syscall.ENOSPC) {
					return nil
				}
				return fmt.Errorf("fill: %w", err)
			}
		}
	}
}

// TestAFullSmallDiskRefusesEverySQLiteWrite: the refuse class's fault on
// SQLite bites. With the disk full, a claim of a fresh run is refused
// (unavailable) however often it is tried, not granted in the room the
// write-ahead log already had; cleared, the claim is granted.
func TestAFullSmallDiskRefusesEverySQLiteWrite(t *testing.T) {
	disk := smallDisk(t)
	if disk == "" {
		testenv.Missing(t, "a tmpfs of the test's own", "mounting one is not permitted here: root only")
	}
	ns := backends.Prepare(t, config.ClaimerSQLite, backends.Options{
		Tune: func(c *config.Claimer) { c.SQLite.Path = filepath.Join(disk, "claims.db") }})
	c := ns.Open("replica")
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	// A log with room in it first: the fault must empty it.
	for i := range 200 {
		cl, err := claim.ClaimOne(t.Context(), c, claim.Run{Job: "job.warm", At: at.Add(time.Duration(i) * time.Minute)}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.ReleaseOne(t.Context(), c, cl, claim.Succeeded); err != nil {
			t.Fatal(err)
		}
	}
	refuse := fullDisk(disk, c.DB)
	if err := refuse(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		_, err := claim.ClaimOne(t.Context(), c, claim.Run{Job: "job.full", At: at.Add(time.Duration(i) * time.Minute)}, time.Minute)
		if !errors.Is(err, claim.ErrUnavailable) {
			t.Fatalf("claim %d on the full disk: %v, want ErrUnavailable", i, err)
		}
	}
	if err := refuse(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	if _, err := claim.ClaimOne(t.Context(), c, claim.Run{Job: "job.full", At: at}, time.Minute); err != nil {
		t.Fatalf("claim once the disk was cleared: %v", err)
	}
}
