package sqlite

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// The processes that share a path coordinate only while the path names one
// database, and the database is three files: the file, its write-ahead log
// (-wal, where the latest commits live until a checkpoint copies them into
// the file) and its shared-memory index (-shm, through which connections
// agree on what the log holds). A process that still has a deleted or
// replaced one of them open keeps a ledger of its own, or corrupts the
// file, while processes that open the path now keep another; database/sql,
// opening connections as it needs them, would even split one process
// between the two. Every run could then execute once per ledger. So a
// Claimer records the three files' identities at Open and, before each
// write, checks that the path still names them.
var suffixes = [...]string{"", "-wal", "-shm"}

// oneName refuses a database file that processes could reach by
// different names, each with a -wal and -shm of its own: a file with
// several hard links, or a file mounted on its own (a container runtime
// mounting one file into each container, -v host.db:/data/s.db). Each
// name would keep a ledger, and every run would execute once per name
// (found by an outside review: 13 of 13 runs twice, fences handed out
// twice, /readyz ready). A directory mounted whole shares its -wal and
// -shm: that is the way to share the file between containers.
func oneName(path string, info os.FileInfo) error {
	if !info.Mode().IsRegular() { // a directory has several links too
		return fmt.Errorf("not a regular file (%s): want the path of the database file, which is created if missing", info.Mode().Type())
	}
	if n := links(info); n > 1 {
		return fmt.Errorf("the file has %d names (hard links): SQLite keeps the write-ahead log and shared memory beside the name a process opens,"+
			" so processes opening it by different names would not see each other's claims and each would run every run;"+
			" open it by one name (copy the file if another is needed)", n)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil // gone meanwhile: the open finds out
	}
	if mountedAlone(real) {
		return errors.New("the file is mounted on its own: SQLite keeps the write-ahead log and shared memory beside it, outside the mount," +
			" so processes that mount the same file elsewhere would not see each other's claims and each would run every run," +
			" and the log would be lost with this mount namespace; mount the directory that holds it instead")
	}
	return nil
}

// isMountPoint says whether path is a mount point in r, a mount table in
// the format of /proc/self/mountinfo (its fifth field, with space, tab,
// newline and backslash escaped in octal).
func isMountPoint(r io.Reader, path string) bool {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == path {
			return true
		}
	}
	return false
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// file is the database a Claimer opened.
type file struct {
	path string // absolute, as configured: the file is what it names
	// real is path with its symbolic links resolved at open: SQLite keeps
	// the -wal and -shm beside the file a link names, not beside the link
	// (found by an outside review: a path that was a link never started).
	// A link retargeted later still shows, as the file's identity.
	real  string
	infos [len(suffixes)]os.FileInfo
	// pin is a connection held for the Claimer's life. SQLite deletes the
	// -wal and -shm when the last connection to the database closes, and
	// they are created anew by the next: held open, they stay the same
	// files unless someone else deletes them.
	pin *sql.Conn

	mu sync.Mutex // serialises check
	// watch is set lost once the path named other files, or none, or the
	// file went back in time (see mark); never cleared.
	watch *claim.FenceWatch
}

// pin holds a connection open on db and records the identities of the
// files the path names, or returns nil if the path named no file before
// the open (before) or another one after it: the open must be made again.
func pin(ctx context.Context, db *sql.DB, path string, before os.FileInfo) (*file, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	// A read opens (creating them if need be) the -wal and -shm, in WAL
	// mode, which the DSN asks for but SQLite declines where the file
	// system cannot share memory.
	var mode string
	if err := conn.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if mode != "wal" {
		_ = conn.Close()
		return nil, fmt.Errorf("journal mode %q, not wal: the file system holding %s cannot hold the database's shared memory", mode, path)
	}
	var n int64
	if err := conn.QueryRowContext(ctx, `SELECT value FROM scheduler_fence WHERE id = 1`).Scan(&n); err != nil {
		_ = conn.Close()
		return nil, err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		_ = conn.Close()
		return nil, nil
	}
	f := &file{path: path, real: real, pin: conn,
		watch: claim.NewFenceWatch(path, "a copy written over it, a backup restored under running replicas?")}
	_ = f.watch.Observed(0, n)
	for i := range suffixes {
		info, err := os.Stat(f.name(i))
		if err != nil || i == 0 && (before == nil || !os.SameFile(before, info)) {
			_ = conn.Close()
			return nil, nil
		}
		if i == 0 {
			if err := oneName(path, info); err != nil {
				_ = conn.Close()
				return nil, err
			}
		}
		f.infos[i] = info
	}
	return f, nil
}

// name is the name of the database's file i: the path itself, then the
// -wal and -shm beside the file it named at open.
func (f *file) name(i int) string {
	if i == 0 {
		return f.path
	}
	return f.real + suffixes[i]
}

// check returns ErrUnavailable once the path no longer names the files
// that were opened. It stays unavailable even if they come back:
// connections opened meanwhile may be on others.
func (f *file) check() error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.watch.Err(); err != nil {
		return err
	}
	for i := range suffixes {
		name := f.name(i)
		now, err := os.Stat(name)
		switch {
		case err == nil && os.SameFile(f.infos[i], now):
			continue
		case err == nil:
			return f.watch.Lose(fmt.Errorf("%w: %s was deleted or replaced since this process opened it, and names another file now;"+
				" this process claims nothing more (a process started now opens the database there)", claim.ErrUnavailable, name))
		case errors.Is(err, fs.ErrNotExist):
			return f.watch.Lose(fmt.Errorf("%w: %s was deleted since this process opened it;"+
				" this process claims nothing more (a process started now opens the database there)", claim.ErrUnavailable, name))
		default: // the directory cannot be read now: say so, and look again next time
			return fmt.Errorf("%w: %w", claim.ErrUnavailable, err)
		}
	}
	return nil
}

// The fence counter only grows. A replica watches it: every grant and
// every read of a run (which reads the counter too) must see it at least
// where it saw it last (a grant strictly above), or the file went back in
// time: a copy written over it in place, a backup restored under running
// replicas, which no file identity shows (found by an outside review: a
// run executed twice, fence 7 handed out after 15). It forgot the runs
// since, and the replica claims nothing more from it. What an operation
// must see is what had been seen when it began (mark): a read begun
// before a grant's commit may end after it with the counter below it.

// mark returns the highest counter value seen so far, for observed or
// granted to compare with when the operation that began now ends.
func (f *file) mark() int64 {
	if f == nil {
		return 0
	}
	return f.watch.Mark()
}

// observed records counter value v, read by an operation begun at mark.
func (f *file) observed(mark, v int64) error {
	if f == nil {
		return nil
	}
	return f.watch.Observed(mark, v)
}

// granted records the fences of grants committed by a write begun at mark.
func (f *file) granted(mark int64, fences ...int64) error {
	if f == nil {
		return nil
	}
	return f.watch.Granted(mark, fences...)
}

// Lost is closed once c stopped claiming for good: the path no longer
// names the database c opened, or the database went back in time. Only a
// new process (or Claimer) can claim from the path again; `scheduler run`
// exits 1 then, so that its supervisor restarts it. Nil for a Claimer
// made by New.
func (c *Claimer) Lost() <-chan struct{} {
	if c.file == nil {
		return nil
	}
	return c.file.watch.Lost()
}

// LostErr says why Lost is closed; nil while it is not.
func (c *Claimer) LostErr() error {
	if c.file == nil {
		return nil
	}
	return c.file.watch.Err()
}
