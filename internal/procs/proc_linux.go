package procs

import (
	"errors"
	"syscall"
)

// childAttr makes a server die with the process that started it, even if
// that process is killed.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }

// Pause stops the server's process (SIGSTOP) until Resume: it reads,
// answers and replicates nothing meanwhile, as a stalled host would.
func (r *Redis) Pause() error {
	if r.cmd == nil {
		return errors.New("redis-server is not running")
	}
	return r.cmd.Process.Signal(syscall.SIGSTOP)
}

// Resume continues a paused server (SIGCONT).
func (r *Redis) Resume() error {
	if r.cmd == nil {
		return errors.New("redis-server is not running")
	}
	return r.cmd.Process.Signal(syscall.SIGCONT)
}

// Pause stops the member's process (SIGSTOP) until Resume: its
// connections stay open, but it reads, answers and replicates nothing
// meanwhile, as a stalled host would.
func (m *EtcdMember) Pause() error {
	if m.cmd == nil {
		return errors.New("etcd " + m.name + " is not running")
	}
	return m.cmd.Process.Signal(syscall.SIGSTOP)
}

// Resume continues a paused member (SIGCONT).
func (m *EtcdMember) Resume() error {
	if m.cmd == nil {
		return errors.New("etcd " + m.name + " is not running")
	}
	return m.cmd.Process.Signal(syscall.SIGCONT)
}
