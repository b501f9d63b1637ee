package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// ArtifactDir is where tests keep screenshots and reports:
// $SCHEDULER_ARTIFACTS, else ./artifacts at the repository root.
func ArtifactDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SCHEDULER_ARTIFACTS")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0) // internal/testenv/browser.go
		dir = filepath.Join(filepath.Dir(file), "..", "..", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Chromium returns the path of a headless-capable Chromium, or reports it
// Missing.
func Chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	Missing(t, "chromium", "not on PATH; .ci/run installs Debian's chromium")
	return ""
}

// Headless runs the browser with the flags that keep it off the network
// (this machine has none) and returns what it printed: use "--dump-dom URL"
// for the rendered page, "--screenshot=FILE URL" for a picture.
func Headless(t testing.TB, browser string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir()}
	out, err := exec.CommandContext(ctx, browser, append(base, args...)...).Output()
	if err != nil {
		t.Fatalf("chromium %v: %v", args, err)
	}
	return string(out)
}
