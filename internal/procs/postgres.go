package procs

import (
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

// PostgresOptions configure StartPostgres.
type PostgresOptions struct {
	// Bin is the directory holding initdb and postgres; "": see
	// PostgresBin.
	Bin string
	// TempDir is where the cluster's directory is made; "": the system's
	// temp directory. Under root the cluster runs as the postgres account,
	// which must be able to enter every directory above it.
	TempDir string
}

// Postgres is a PostgreSQL cluster made by initdb in a temporary
// directory, served on a free loopback port. A crash is an immediate
// shutdown (SIGQUIT: no checkpoint), so the next start replays the WAL:
// committed transactions survive, as they must on a real server, and what
// was in flight is lost. Its methods are not safe for concurrent use.
type Postgres struct {
	bin  string // directory holding initdb and postgres
	dir  string // temporary directory; the cluster is dir/data
	port int
	cred *syscall.Credential // whom the server runs as: PostgreSQL refuses root
	cmd  *exec.Cmd
	// exited is closed once cmd has been reaped.
	exited chan struct{}
	log    *logTail
}

// PostgresUser is the superuser initdb creates in a private cluster.
const PostgresUser = "scheduler"

// PostgresBin finds the directory holding initdb and postgres: dir when
// set, else initdb's directory on PATH, else what pg_config reports. Its
// error is Unavailable when there is none.
func PostgresBin(dir string) (string, error) {
	if dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err != nil {
			return "", fmt.Errorf("%s: no initdb there", dir)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", &Unavailable{"no initdb on PATH or in pg_config --bindir"}
}

// serverCredential is whom a private cluster runs as. PostgreSQL refuses
// to run as root, so under root it is the postgres account, if there is one.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, &Unavailable{"running as root, and PostgreSQL will not: no postgres account to run a private cluster as"}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("postgres account: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// StartPostgres creates a cluster and starts it.
func StartPostgres(ctx context.Context, o PostgresOptions) (*Postgres, error) {
	bin, err := PostgresBin(o.Bin)
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(o.TempDir, "scheduler-pg-*")
	if err != nil {
		return nil, err
	}
	s := &Postgres{bin: bin, dir: dir, cred: cred}
	if err := s.init(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if s.port, err = FreePort(); err == nil {
		err = s.Start(ctx)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Postgres) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = childAttr()
	cmd.SysProcAttr.Credential = s.cred
	cmd.WaitDelay = waitDelay
	return cmd
}

// init runs initdb: trust authentication on loopback only, no fsync (a
// crash of the server, not of the machine, is what a private cluster is
// for).
func (s *Postgres) init(ctx context.Context) error {
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("private cluster: %w", err)
		}
	}
	cmd := s.command("initdb", "-D", filepath.Join(s.dir, "data"), "-U", PostgresUser, "--auth=trust",
		"--no-sync", "--encoding=UTF8", "--locale=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		if s.cred != nil && errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("initdb: %v (it runs as the postgres account, which must be able to enter every directory above %s)", err, s.dir)
		}
		return fmt.Errorf("initdb: %v: %s", err, lastLines(out, 5))
	}
	return ctx.Err()
}

// DSN reaches the cluster over TCP as PostgresUser.
func (s *Postgres) DSN() string {
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", PostgresUser, s.Addr())
}

// Addr is the server's host:port.
func (s *Postgres) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Start runs the postmaster in the foreground of a child process, on the
// same port and data as before, and waits until it accepts a query (after
// a crash, that is after WAL replay). A running server is left alone.
func (s *Postgres) Start(ctx context.Context) error {
	if s.cmd != nil {
		return nil
	}
	s.log = newLogTail("")
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
			return exitedErr("postgres", s.port, s.log)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop(syscall.SIGQUIT)
			return fmt.Errorf("postgres on port %d not ready: %w", s.port, err)
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

// stop signals the postmaster and waits for it and its children to go:
// SIGQUIT is an immediate shutdown (a crash: recovery at the next start),
// SIGINT a fast, clean one. SIGKILL would orphan the backends, which keep
// the shared memory the next start needs.
func (s *Postgres) stop(sig syscall.Signal) {
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

// Crash shuts the server down at once, as a crash would: started again,
// it recovers from its WAL.
func (s *Postgres) Crash() { s.stop(syscall.SIGQUIT) }

// Stop shuts the server down cleanly (a fast shutdown).
func (s *Postgres) Stop() { s.stop(syscall.SIGINT) }

// Close shuts the server down and removes its directory.
func (s *Postgres) Close() {
	s.Stop()
	_ = os.RemoveAll(s.dir)
}
