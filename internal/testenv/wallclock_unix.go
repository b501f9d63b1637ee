//go:build unix

package testenv

import (
	"os"
	"syscall"
)

// lockFile waits for an exclusive lock on f, held until f is closed.
func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}
