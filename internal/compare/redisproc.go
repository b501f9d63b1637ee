package compare

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// redisServer is a redis-server process compare started for one cell, on a
// free loopback port, without persistence: a restart loses every key, as a
// node that crashed without AOF/RDB would. It is stopped by its pid.
type redisServer struct {
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
}

// startRedis starts a private redis-server with bin in a fresh directory.
func startRedis(ctx context.Context, bin string) (*redisServer, error) {
	dir, err := os.MkdirTemp("", "scheduler-compare-redis-*")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &redisServer{bin: bin, dir: dir, port: port}
	if err := s.start(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Addr is the server's host:port.
func (s *redisServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// start launches the process on s.port and waits until it accepts
// connections. Its log goes nowhere (stdout is /dev/null).
func (s *redisServer) start(ctx context.Context) error {
	cmd := exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--daemonize", "no")
	cmd.Dir = s.dir
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return fmt.Errorf("redis-server on port %d not ready: %w", s.port, err)
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// stop kills the process (SIGKILL: its data is gone) and reaps it.
func (s *redisServer) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// crash kills the server: started again, it is empty.
func (s *redisServer) crash() { s.stop() }

// close stops the server and removes its directory.
func (s *redisServer) close() {
	s.stop()
	_ = os.RemoveAll(s.dir)
}

// freePort asks the kernel for an unused loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
