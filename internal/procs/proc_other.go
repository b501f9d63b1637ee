//go:build !linux

package procs

import (
	"errors"
	"syscall"
)

func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// Pause is not supported off Linux.
func (r *Redis) Pause() error { return errors.New("pausing a process is supported on Linux only") }

// Resume is not supported off Linux.
func (r *Redis) Resume() error { return errors.New("pausing a process is supported on Linux only") }

// Pause is not supported off Linux.
func (m *EtcdMember) Pause() error { return errors.New("pausing a process is supported on Linux only") }

// Resume is not supported off Linux.
func (m *EtcdMember) Resume() error {
	return errors.New("pausing a process is supported on Linux only")
}

// Pause is not supported off Linux.
func (s *Postgres) Pause() error { return errors.New("pausing a process is supported on Linux only") }

// Resume is not supported off Linux.
func (s *Postgres) Resume() error { return errors.New("pausing a process is supported on Linux only") }
