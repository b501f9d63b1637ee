//go:build !unix

package testenv

import "os"

// lockFile does not serialise wall-clock tests where flock is missing;
// run them with go test -p 1 there.
func lockFile(*os.File) error { return nil }

// shareFile does nothing where flock is missing (see lockFile).
func shareFile(*os.File) error { return nil }
