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
	"net"
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

// FreePort asks the kernel for an unused loopback port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
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
