package procs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// EtcdOptions configure StartEtcd.
type EtcdOptions struct {
	// Bin is the etcd binary; "": etcd on PATH.
	Bin string
	// Dir holds one data directory per member; "": a fresh temporary
	// directory, removed by Close.
	Dir string
	// Members is the cluster's size (default 3).
	Members int
	// Heartbeat and Election are the raft timings (default 100ms and
	// 1s, etcd's own). They also set the shortest lease the cluster
	// grants: 1.5 election timeouts, rounded up to whole seconds.
	Heartbeat, Election time.Duration
	// Args are passed to every member after the launcher's own.
	Args []string
}

// Etcd is a cluster of etcd members on free loopback ports, each a child
// process that can be killed (SIGKILL) and started again on the same
// ports and data directory: etcd syncs its WAL on every commit, so a
// killed member keeps what it acknowledged. Its methods are not safe for
// concurrent use.
type Etcd struct {
	dir     string
	ownDir  bool
	members []*EtcdMember
}

// EtcdMember is one member of an Etcd cluster.
type EtcdMember struct {
	bin        string
	name       string
	dataDir    string
	clientPort int
	peerPort   int
	args       []string // every flag but the data's state
	cmd        *exec.Cmd
	exited     chan struct{} // closed once cmd has been reaped
	log        *logTail
}

// EtcdBin finds etcd: bin when set, else on PATH. Its error is
// Unavailable when there is none.
func EtcdBin(bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	p, err := exec.LookPath("etcd")
	if err != nil {
		return "", &Unavailable{"no etcd on PATH"}
	}
	return p, nil
}

// StartEtcd starts a private cluster and waits until every member serves
// clients.
func StartEtcd(ctx context.Context, o EtcdOptions) (*Etcd, error) {
	bin, err := EtcdBin(o.Bin)
	if err != nil {
		return nil, err
	}
	n := o.Members
	if n <= 0 {
		n = 3
	}
	heartbeat, election := o.Heartbeat, o.Election
	if heartbeat <= 0 {
		heartbeat = 100 * time.Millisecond
	}
	if election <= 0 {
		election = 10 * heartbeat
	}
	e := &Etcd{dir: o.Dir}
	if e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "scheduler-etcd-*"); err != nil {
			return nil, err
		}
		e.ownDir = true
	}
	var tok [8]byte
	_, _ = rand.Read(tok[:])
	var peers []string
	for i := range n {
		m := &EtcdMember{bin: bin, name: fmt.Sprintf("m%d", i), dataDir: filepath.Join(e.dir, fmt.Sprintf("m%d", i))}
		if m.clientPort, err = FreePort(); err == nil {
			m.peerPort, err = FreePort()
		}
		if err != nil {
			e.Close()
			return nil, err
		}
		e.members = append(e.members, m)
		peers = append(peers, m.name+"="+m.peerURL())
	}
	for _, m := range e.members {
		m.args = append([]string{
			"--name", m.name, "--data-dir", m.dataDir,
			"--listen-client-urls", m.clientURL(), "--advertise-client-urls", m.clientURL(),
			"--listen-peer-urls", m.peerURL(), "--initial-advertise-peer-urls", m.peerURL(),
			"--initial-cluster", strings.Join(peers, ","),
			"--initial-cluster-token", "scheduler-" + hex.EncodeToString(tok[:]),
			"--initial-cluster-state", "new",
			"--heartbeat-interval", strconv.FormatInt(heartbeat.Milliseconds(), 10),
			"--election-timeout", strconv.FormatInt(election.Milliseconds(), 10),
			"--logger", "zap", "--log-outputs", "stderr",
		}, o.Args...)
	}
	// A member becomes ready only once a quorum has formed, so all of
	// them are started before any is waited for.
	for _, m := range e.members {
		if err := m.spawn(); err != nil {
			e.Close()
			return nil, err
		}
	}
	for _, m := range e.members {
		if err := m.await(ctx); err != nil {
			e.Close()
			return nil, err
		}
	}
	return e, nil
}

// Members returns the cluster's members, in the order of Endpoints.
func (e *Etcd) Members() []*EtcdMember { return e.members }

// Endpoints are the members' client addresses (host:port).
func (e *Etcd) Endpoints() []string {
	out := make([]string, len(e.members))
	for i, m := range e.members {
		out[i] = m.Addr()
	}
	return out
}

// Close stops every member and removes the directory if StartEtcd made it.
func (e *Etcd) Close() {
	for _, m := range e.members {
		m.Stop()
	}
	if e.ownDir {
		_ = os.RemoveAll(e.dir)
	}
}

// Wipe kills every member (SIGKILL), removes their data directories and
// starts them again as a new cluster on the same ports, with the same
// names and token (so the same cluster and member ids): a cluster that
// lost everything it had acknowledged. It waits until every member
// serves clients.
func (e *Etcd) Wipe(ctx context.Context) error {
	for _, m := range e.members {
		m.Stop()
	}
	for _, m := range e.members {
		if err := os.RemoveAll(m.dataDir); err != nil {
			return err
		}
	}
	for _, m := range e.members {
		if err := m.spawn(); err != nil {
			return err
		}
	}
	for _, m := range e.members {
		if err := m.await(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Name is the member's name in the cluster.
func (m *EtcdMember) Name() string { return m.name }

// Addr is the member's client address, host:port.
func (m *EtcdMember) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clientPort))
}

func (m *EtcdMember) clientURL() string { return "http://" + m.Addr() }

func (m *EtcdMember) peerURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.peerPort))
}

// Running reports whether the member's process is up.
func (m *EtcdMember) Running() bool { return m.cmd != nil }

// Start starts a stopped member again on its ports and data directory,
// and waits until it serves clients, which needs a quorum of the cluster
// up. A running member is left alone.
func (m *EtcdMember) Start(ctx context.Context) error {
	if m.cmd != nil {
		return nil
	}
	if err := m.spawn(); err != nil {
		return err
	}
	return m.await(ctx)
}

func (m *EtcdMember) spawn() error {
	cmd := exec.Command(m.bin, m.args...)
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = waitDelay
	// Logged once the member has joined a quorum (embed/serve.go).
	m.log = newLogTail("serving client traffic")
	cmd.Stdout, cmd.Stderr = m.log, m.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	m.cmd, m.exited = cmd, make(chan struct{})
	exited := m.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	return nil
}

// await waits until the member logs that it serves clients and accepts a
// connection.
func (m *EtcdMember) await(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case <-m.log.ready:
	case <-m.exited:
		m.cmd = nil
		return exitedErr("etcd "+m.name, m.clientPort, m.log)
	case <-ctx.Done():
		m.Stop()
		return fmt.Errorf("etcd %s on port %d not ready: %w (%s)", m.name, m.clientPort, ctx.Err(), m.log.last(3))
	}
	for {
		c, err := net.DialTimeout("tcp", m.Addr(), 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if ctx.Err() != nil {
			m.Stop()
			return errors.Join(fmt.Errorf("etcd %s on port %d", m.name, m.clientPort), err)
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// Stop kills the member (SIGKILL) and reaps it.
func (m *EtcdMember) Stop() {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.exited
	m.cmd = nil
}

// Log is the member's last lines of output, for a failure message.
func (m *EtcdMember) Log() string {
	if m.log == nil {
		return ""
	}
	return m.log.last(tailLines)
}
