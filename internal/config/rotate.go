package config

import (
	"errors"
	"strings"
	"sync"
)

// readSecret reads a password_file's secret: its content, without a
// trailing line break.
func readSecret(path string) (Secret, error) {
	b, err := readSmall(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", errors.New("empty file")
	}
	return Secret(s), nil
}

// Rotating returns what a client calls for its password each time it
// opens a connection: the secret in path read anew, so that a rotated
// secret (a Kubernetes secret the kubelet rewrites in place, the
// database's password changed with it) is used from the next connection
// on, without a restart. Read once at load, a rotated password failed
// every new connection for good, while /healthz stayed up and no probe
// restarted the replica (an outside review). A read that fails (the file
// mid-rewrite) gives the last secret read. first is the secret Load read.
func Rotating(path string, first Secret) func() Secret {
	var mu sync.Mutex
	last := first
	return func() Secret {
		s, err := readSecret(path)
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			last = s
		}
		return last
	}
}
