//go:build linux

package sqlite

import (
	"os"
	"syscall"
)

// links is the number of names (hard links) the file of info has.
func links(info os.FileInfo) uint64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}

// mountedAlone says whether path (absolute, its links resolved) is a
// mount point of this process's mount namespace: a file mounted on its
// own, as a container runtime mounts a single file. Where the mount
// table cannot be read it says no.
func mountedAlone(path string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	return isMountPoint(f, path)
}
