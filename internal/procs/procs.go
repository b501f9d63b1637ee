// Package procs starts the backend servers compare, the tests and the
// benchmarks run privately: redis-server (alone, or several made a
// Redis Cluster by redis-cli), etcd members and PostgreSQL (initdb, then
// postgres), each on a free loopback port, each a child process that can
// be crashed and started again on the same port and data, and that dies
// with the process that started it (Pdeathsig, on Linux). It is not test
// code: `scheduler compare` starts these servers in production.
package procs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Unavailable is the error of a launcher that cannot run here: its
// program is not installed, or cannot run as this account. Callers may
// skip rather than fail.
type Unavailable struct{ Why string }

func (e *Unavailable) Error() string { return e.Why }

// IsUnavailable reports whether err says a launcher cannot run here.
func IsUnavailable(err error) bool {
	var u *Unavailable
	return errors.As(err, &u)
}

// FreePort returns an unused loopback port below the kernel's ephemeral
// range. The servers started here are killed and started again on the
// same port; a port the kernel hands out can meanwhile become the local
// port of some client's connection, and the restart then fails with
// "address already in use" (CI: a Redis Cluster node's bus port). Ports
// below the range are never handed to a connection.
//
// It never returns a port twice in one process: a port handed out is
// free until its server binds it, so two draws before that could meet
// (CI: an etcd cluster whose two members got one peer port, "initial
// cluster … has duplicate url").
func FreePort() (int, error) {
	lo := ephemeralStart()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		port := 10000 + rand.IntN(lo-10000)
		if handedOut.ports[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken: draw again
		}
		_ = l.Close()
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free loopback port in [10000, %d)", lo)
}

// handedOut is every port FreePort returned in this process.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// ephemeralStart is the first port of the kernel's ephemeral range
// (Linux's ip_local_port_range; 32768 where it cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 11000 {
		return 32768
	}
	return n
}

// logTail keeps a process's last lines of output, for an error message,
// and closes ready once a line contains the ready marker.
type logTail struct {
	marker string
	ready  chan struct{}

	mu    sync.Mutex
	buf   bytes.Buffer // the incomplete last line
	lines []string
}

const tailLines = 20

func newLogTail(marker string) *logTail {
	return &logTail{marker: marker, ready: make(chan struct{})}
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil { // no newline yet: keep it for the next write
			l.buf.Reset()
			l.buf.WriteString(line)
			return len(p), nil
		}
		line = strings.TrimRight(line, "\r\n")
		if l.marker != "" && strings.Contains(line, l.marker) {
			select {
			case <-l.ready:
			default:
				close(l.ready)
			}
		}
		l.lines = append(l.lines, line)
		if len(l.lines) > tailLines {
			l.lines = l.lines[len(l.lines)-tailLines:]
		}
	}
}

// last is the last n lines, joined for an error message.
func (l *logTail) last(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := append(l.lines, strings.TrimSpace(l.buf.String()))
	var out []string
	for _, s := range lines {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out[max(0, len(out)-n):], " | ")
}

// lastLines is the tail of a command's combined output.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// sleep waits d, or less if ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// waitDelay bounds how long reaping a killed server waits for a child it
// forked (a redis AOF rewrite, a postgres backend) to let go of its output.
const waitDelay = 5 * time.Second

// exitedErr is Start's error when the server exited while starting.
func exitedErr(what string, port int, log *logTail) error {
	return fmt.Errorf("%s on port %d exited: %s", what, port, log.last(5))
}
