package procs

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// RedisOptions configure StartRedis.
type RedisOptions struct {
	// Bin is the redis-server binary; "": redis-server on PATH.
	Bin string
	// Dir is the server's working directory, where it keeps an RDB
	// snapshot or an AOF when Args turn persistence on; "": a fresh
	// temporary directory, removed by Close.
	Dir string
	// Args are passed to redis-server after the launcher's own
	// (--port, --bind 127.0.0.1, no persistence, --dir), so they may
	// override them: "--appendonly", "yes", say, or "--maxmemory", "1mb".
	Args []string
}

// Redis is a redis-server process on a free loopback port, without
// persistence unless its Args turn it on: a crash then loses every key, as
// a node that crashed without AOF/RDB would. It is stopped by its pid.
// Its methods are not safe for concurrent use.
type Redis struct {
	bin    string
	dir    string
	ownDir bool
	port   int
	args   []string
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been reaped
	log    *logTail
}

// RedisBin finds redis-server: bin when set, else on PATH. Its error is
// Unavailable when there is none.
func RedisBin(bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", &Unavailable{"no redis-server on PATH"}
	}
	return p, nil
}

// StartRedis starts a private redis-server and waits until it is ready.
func StartRedis(ctx context.Context, o RedisOptions) (*Redis, error) {
	bin, err := RedisBin(o.Bin)
	if err != nil {
		return nil, err
	}
	r := &Redis{bin: bin, dir: o.Dir, args: o.Args}
	if r.dir == "" {
		if r.dir, err = os.MkdirTemp("", "scheduler-redis-*"); err != nil {
			return nil, err
		}
		r.ownDir = true
	}
	if r.port, err = FreePort(); err == nil {
		err = r.Start(ctx)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Addr is the server's host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Port is the server's port.
func (r *Redis) Port() int { return r.port }

// Dir is the server's working directory (see RedisOptions.Dir).
func (r *Redis) Dir() string { return r.dir }

// Start (re)starts the process on the same port and directory, and waits
// until it has loaded its data and accepts connections: empty, unless
// persistence is on or a snapshot was saved (SAVE). A running server is
// left alone.
func (r *Redis) Start(ctx context.Context) error {
	if r.cmd != nil {
		return nil
	}
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no"}, r.args...)
	cmd := exec.Command(r.bin, args...)
	cmd.Dir = r.dir
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = waitDelay
	r.log = newLogTail("Ready to accept connections")
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	exited := r.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	select {
	case <-r.log.ready:
	case <-exited:
		r.cmd = nil
		return exitedErr("redis-server", r.port, r.log)
	case <-ctx.Done():
		r.Stop()
		return fmt.Errorf("redis-server on port %d not ready: %w (%s)", r.port, ctx.Err(), r.log.last(3))
	}
	// The log says it listens; a connection proves it.
	for {
		c, err := net.DialTimeout("tcp", r.Addr(), 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if ctx.Err() != nil {
			r.Stop()
			return fmt.Errorf("redis-server on port %d: %w", r.port, err)
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// Stop kills the process (SIGKILL: what it did not persist is gone) and
// reaps it.
func (r *Redis) Stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.cmd = nil
}

// Crash is Stop: a crash is what SIGKILL is.
func (r *Redis) Crash() { r.Stop() }

// Restart kills the server and starts it again on the same port and
// directory.
func (r *Redis) Restart(ctx context.Context) error {
	r.Stop()
	return r.Start(ctx)
}

// Close stops the server and removes its directory if StartRedis made it.
func (r *Redis) Close() {
	r.Stop()
	if r.ownDir {
		_ = os.RemoveAll(r.dir)
	}
}
