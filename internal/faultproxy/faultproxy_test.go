package faultproxy_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo is a line server: it records every line it receives and echoes it.
type echo struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	got  []string
	cons []net.Conn
}

func startEcho(t *testing.T) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln}
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.cons = append(e.cons, c)
			e.mu.Unlock()
			e.wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						e.mu.Lock()
						e.got = append(e.got, string(buf[:n]))
						e.mu.Unlock()
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		e.mu.Lock()
		for _, c := range e.cons {
			_ = c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *echo) received() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads len(msg) bytes back within timeout.
func roundTrip(c net.Conn, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// isReset reports an aborted connection: a reset, or an EOF when the RST
// raced the read.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling state the proxy does not signal
	}
}

func TestForwardsBothWays(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	for _, msg := range []string{"hello", "world"} {
		got, err := roundTrip(c, msg, 5*time.Second)
		if err != nil || got != msg {
			t.Fatalf("round trip %q = %q, %v", msg, got, err)
		}
	}
	if p.Links() != 1 {
		t.Fatalf("Links = %d, want 1", p.Links())
	}
	_ = c.Close()
	waitUntil(t, "the link to close after the client's FIN", func() bool { return p.Links() == 0 })
}

func TestLatencyDelaysEachDirection(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	const lat = 150 * time.Millisecond
	p.SetLatency(lat)
	start := time.Now()
	if _, err := roundTrip(c, "x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 2*lat {
		t.Fatalf("round trip took %v, want at least %v (latency each way)", rtt, 2*lat)
	}
	p.SetLatency(0)
	if _, err := roundTrip(c, "y", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestResetAllAbortsOpenConnections(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.ResetAll()
	_, err := roundTrip(c, "b", 5*time.Second)
	if !isReset(err) {
		t.Fatalf("after ResetAll: %v, want a reset", err)
	}
	// New connections work again.
	if got, err := roundTrip(dial(t, p.Addr()), "c", 5*time.Second); err != nil || got != "c" {
		t.Fatalf("new connection after reset: %q, %v", got, err)
	}
}

func TestPartitionHoldsBytesUntilItLifts(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	old := dial(t, p.Addr())
	if _, err := roundTrip(old, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Partition(true)
	// An existing connection goes silent; the server never sees the bytes.
	if _, err := roundTrip(old, "held-old", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("existing connection during partition: %v, want a timeout", err)
	}
	// A new connection is accepted, then held.
	fresh := dial(t, p.Addr())
	if _, err := roundTrip(fresh, "held-new", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection during partition: %v, want a timeout", err)
	}
	for _, r := range e.received() {
		if r != "before" {
			t.Fatalf("server received %q during the partition", r)
		}
	}
	p.Partition(false)
	// Held bytes are delivered, in order, once the partition lifts.
	for _, x := range []struct {
		c    net.Conn
		want string
	}{{old, "held-old"}, {fresh, "held-new"}} {
		buf := make([]byte, len(x.want))
		_ = x.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(x.c, buf); err != nil || string(buf) != x.want {
			t.Fatalf("after the partition: %q, %v; want %q", buf, err, x.want)
		}
	}
}

func TestDropRepliesExecutesRequestButSwallowsReply(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	p.DropReplies(1, func(b []byte) bool { return bytes.Contains(b, []byte("claim")) })
	if got, err := roundTrip(c, "ping", 5*time.Second); err != nil || got != "ping" {
		t.Fatalf("non-matching reply: %q, %v", got, err)
	}
	_, err := roundTrip(c, "claim", 5*time.Second)
	if !isReset(err) {
		t.Fatalf("swallowed reply: %v, want a reset", err)
	}
	waitUntil(t, "the server to receive the request", func() bool {
		r := e.received()
		return len(r) == 2 && r[1] == "claim"
	})
	// Only one reply was to be dropped.
	if got, err := roundTrip(dial(t, p.Addr()), "claim", 5*time.Second); err != nil || got != "claim" {
		t.Fatalf("second matching reply: %q, %v", got, err)
	}
}

func TestDropRequestsNeverReachTheServer(t *testing.T) {
	e := startEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p.Addr())
	p.DropRequests(1, nil)
	if _, err := roundTrip(c, "lost", 5*time.Second); !isReset(err) {
		t.Fatalf("dropped request: %v, want a reset", err)
	}
	if got, err := roundTrip(dial(t, p.Addr()), "kept", 5*time.Second); err != nil || got != "kept" {
		t.Fatalf("next request: %q, %v", got, err)
	}
	for _, r := range e.received() {
		if r == "lost" {
			t.Fatal("the server received a dropped request")
		}
	}
}

func TestCloseEndsEverythingEvenDuringAPartition(t *testing.T) {
	e := startEcho(t)
	p, err := faultproxy.New(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(time.Hour)
	p.Partition(true)
	held := dial(t, p.Addr())
	_, _ = held.Write([]byte("held"))
	_, _ = c.Write([]byte("late"))
	done := make(chan struct{})
	go func() { _ = p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if _, err := roundTrip(c, "b", 5*time.Second); err == nil {
		t.Fatal("connection still forwarded after Close")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
}

func TestTargetDownClosesTheClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	p := newProxy(t, addr)
	c := dial(t, p.Addr())
	if _, err := roundTrip(c, "x", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("target down: %v, want the connection closed", err)
	}
}
