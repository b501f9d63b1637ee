//go:build !linux

package procs

import "syscall"

func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
