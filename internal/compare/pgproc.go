package compare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgServer is a PostgreSQL cluster compare created for one cell (initdb in
// a temporary directory) and serves on a free loopback port. Unlike the
// shared server a team points --postgres-dsn at, compare may crash and
// restart it: that is the postgres-restart fault. A restart is an
// immediate shutdown (SIGQUIT: no checkpoint, as after a crash), so the
// next start replays the WAL; committed claims survive, as they must on a
// real server, and what was in flight is lost.
type pgServer struct {
	bin  string // directory holding initdb and postgres
	dir  string // temporary directory; the cluster is dir/data
	port int
	cred *syscall.Credential // whom the server runs as: PostgreSQL refuses root
	cmd  *exec.Cmd
	// exited is closed once cmd has been reaped; log, the server's output
	// for an error that needs it, may be read from then on.
	exited chan struct{}
	log    *bytes.Buffer
}

// pgUser is the superuser initdb creates in a private cluster.
const pgUser = "scheduler"

// postgresBin finds the directory holding initdb and postgres: o.PostgresBin,
// else initdb's directory on PATH, else what pg_config reports.
func (o *Options) postgresBin() (string, error) {
	if o.PostgresBin != "" {
		if _, err := os.Stat(filepath.Join(o.PostgresBin, "initdb")); err != nil {
			return "", fmt.Errorf("--postgres-bin %s: no initdb there", o.PostgresBin)
		}
		return o.PostgresBin, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	return "", errSkip{"no initdb on PATH or in pg_config --bindir (give --postgres-bin)"}
}

// serverCredential is whom a private cluster runs as. PostgreSQL refuses
// to run as root, so under root it is the postgres account, if there is one.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errSkip{"running as root, and PostgreSQL will not: no postgres account to run a private cluster as"}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("postgres account: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// startPostgres creates a cluster with the binaries in bin and starts it.
func startPostgres(ctx context.Context, bin, tempDir string) (*pgServer, error) {
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(tempDir, "scheduler-compare-pg-*")
	if err != nil {
		return nil, err
	}
	s := &pgServer{bin: bin, dir: dir, cred: cred}
	if err := s.init(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if s.port, err = freePort(); err == nil {
		err = s.start(ctx)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *pgServer) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = childAttr()
	if s.cred != nil {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Credential = s.cred
	}
	return cmd
}

// init runs initdb: trust authentication on loopback only, no fsync (a
// crash of the server, not of the machine, is what the fault is about).
func (s *pgServer) init(ctx context.Context) error {
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("private cluster: %w", err)
		}
	}
	cmd := s.command("initdb", "-D", filepath.Join(s.dir, "data"), "-U", pgUser, "--auth=trust",
		"--no-sync", "--encoding=UTF8", "--locale=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		if s.cred != nil && errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("initdb: %v (it runs as the postgres account, which must be able to enter every directory above %s)", err, s.dir)
		}
		return fmt.Errorf("initdb: %v: %s", err, lastLines(out, 5))
	}
	return ctx.Err()
}

// DSN reaches the cluster over TCP.
func (s *pgServer) DSN() string {
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", pgUser, s.Addr())
}

// Addr is the server's host:port.
func (s *pgServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// start runs the postmaster in the foreground of a child process and waits
// until it accepts a query (after a crash, that is after WAL replay).
func (s *pgServer) start(ctx context.Context) error {
	s.log = &bytes.Buffer{}
	cmd := s.command("postgres", "-D", filepath.Join(s.dir, "data"), "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "shared_buffers=16MB",
		"-c", "max_connections=200", "-c", "logging_collector=off")
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	exited := s.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, s.DSN())
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("postgres on port %d exited: %s", s.port, lastLines(s.log.Bytes(), 5))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop(syscall.SIGQUIT)
			return fmt.Errorf("postgres on port %d not ready: %w", s.port, err)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// stop signals the postmaster and waits for it and its children to go:
// SIGQUIT is an immediate shutdown (a crash: recovery at the next start),
// SIGINT a fast, clean one. SIGKILL would orphan the backends, which keep
// the shared memory the next start needs.
func (s *pgServer) stop(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// crash shuts the server down at once, as a crash would: started again,
// it recovers from its WAL.
func (s *pgServer) crash() { s.stop(syscall.SIGQUIT) }

// close shuts the server down and removes its directory.
func (s *pgServer) close() {
	s.stop(syscall.SIGINT)
	_ = os.RemoveAll(s.dir)
}

// lastLines is the tail of a process's output, for an error message.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}
