package sqlite

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// TestAFileWithSeveralNamesIsRefused: SQLite keeps a database's -wal and
// -shm beside the name a process opens, so processes that reach one file
// by different names (hard links, a file mounted on its own into each
// container) each keep a ledger, and every run executes once per name.
// Such a file is refused at open, by every name, before anything is
// written through it.
func TestAFileWithSeveralNamesIsRefused(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("names are counted on Linux only")
	}
	created := func(t *testing.T) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "shared.db")
		c, err := Open(t.Context(), path, Options{Instance: "first"})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	refused := func(t *testing.T, path, says string) {
		t.Helper()
		c, err := Open(t.Context(), path, Options{Instance: "second"})
		if err == nil {
			_ = c.Close()
			t.Fatalf("%s opened", path)
		}
		if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), says) {
			t.Fatalf("open %s: %v; want the path and %q", path, err, says)
		}
		if _, err := os.Stat(path + "-wal"); err == nil {
			t.Errorf("%s-wal exists: the refused open wrote through the name", path)
		}
	}

	t.Run("hard link", func(t *testing.T) {
		path := created(t)
		other := filepath.Join(t.TempDir(), "other.db")
		if err := os.Link(path, other); err != nil {
			t.Fatal(err)
		}
		refused(t, other, "has 2 names (hard links)")
		refused(t, path, "has 2 names (hard links)")
		if err := os.Remove(other); err != nil {
			t.Fatal(err)
		}
		c, err := Open(t.Context(), path, Options{Instance: "again"})
		if err != nil {
			t.Fatalf("one name again: %v", err)
		}
		_ = c.Close()
	})

	// Neither is a file: SQLite would say only "unable to open database
	// file" (the directory's own links read as a second name).
	t.Run("a directory", func(t *testing.T) {
		refused(t, t.TempDir(), "not a regular file")
	})
	t.Run("in a missing directory", func(t *testing.T) {
		refused(t, filepath.Join(t.TempDir(), "gone", "claims.db"), "its directory: stat")
	})

	t.Run("mounted on its own", func(t *testing.T) {
		path := created(t)
		target := filepath.Join(t.TempDir(), "mounted.db")
		if err := os.WriteFile(target, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(path, target, "", syscall.MS_BIND, ""); err != nil {
			// CI runs as root and mounts; a developer's account may not.
			testenv.Missing(t, "a bind mount of one file", fmt.Sprintf("%v: needs CAP_SYS_ADMIN", err))
		}
		t.Cleanup(func() { _ = syscall.Unmount(target, 0) })
		refused(t, target, "mounted on its own")
		// The name it was created by is no mount point: it opens, and the
		// mounted name stays refused.
		c, err := Open(t.Context(), path, Options{Instance: "host"})
		if err != nil {
			t.Fatalf("the file's own name: %v", err)
		}
		_ = c.Close()
	})
}

func TestIsMountPoint(t *testing.T) {
	table := `22 1 0:21 / /proc rw,nosuid - proc proc rw
36 35 98:0 /data/a.db /srv/app\040one/s.db rw,noatime master:1 - ext4 /dev/root rw
37 35 98:0 /data /srv/dir rw - ext4 /dev/root rw
`
	for path, want := range map[string]bool{
		"/srv/app one/s.db": true, "/srv/dir": true, "/proc": true,
		`/srv/app\040one/s.db`: false, "/srv/dir/s.db": false, "/data/a.db": false,
	} {
		if got := isMountPoint(strings.NewReader(table), path); got != want {
			t.Errorf("isMountPoint(%q) = %v, want %v", path, got, want)
		}
	}
}
