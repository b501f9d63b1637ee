package compare

import "syscall"

// childAttr makes a redis-server compare started die with it, even if
// compare itself is killed.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
