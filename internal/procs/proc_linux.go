package procs

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
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

// Pause stops the cluster (SIGSTOP) until Resume: the postmaster first, so
// that it forks no new backend, then every process it forked (the
// connections' backends, the WAL writer, the checkpointer). Connections
// stay open, but nothing is read, answered or written meanwhile, as on a
// stalled host.
func (s *Postgres) Pause() error { return s.signalAll(syscall.SIGSTOP) }

// Resume continues a paused cluster (SIGCONT), its backends first.
func (s *Postgres) Resume() error { return s.signalAll(syscall.SIGCONT) }

// signalAll sends sig to the postmaster and to its children: for SIGSTOP
// the postmaster first, for anything else last.
func (s *Postgres) signalAll(sig syscall.Signal) error {
	if s.cmd == nil {
		return errors.New("postgres is not running")
	}
	pid := s.cmd.Process.Pid
	if sig == syscall.SIGSTOP {
		if err := syscall.Kill(pid, sig); err != nil {
			return err
		}
	}
	kids, err := children(pid)
	if err != nil {
		return err
	}
	for _, k := range kids {
		_ = syscall.Kill(k, sig) // a backend that exited meanwhile is gone
	}
	if sig != syscall.SIGSTOP {
		return syscall.Kill(pid, sig)
	}
	return nil
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var kids []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses,
		// so the fields are read after its last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			kids = append(kids, child)
		}
	}
	return kids, nil
}
