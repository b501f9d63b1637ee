//go:build !linux

package compare

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }
