//go:build !linux

package sqlite

import "os"

// links is the number of names the file of info has: not read here.
func links(os.FileInfo) uint64 { return 1 }

// mountedAlone says whether path is a mount point: not read here.
func mountedAlone(string) bool { return false }
