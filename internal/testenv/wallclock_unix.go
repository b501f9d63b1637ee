//go:build unix

package testenv

import (
	"os"
	"syscall"
)

// lockFile waits for an exclusive lock on f, held until f is closed.
func lockFile(f *os.File) error { return flock(f, syscall.LOCK_EX) }

// shareFile waits for a shared lock on f, held until f is closed: held
// beside other shared locks, never beside the exclusive one.
func shareFile(f *os.File) error { return flock(f, syscall.LOCK_SH) }

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}
