package procs

import "syscall"

// childAttr makes a server die with the process that started it, even if
// that process is killed.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
