package main_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestShippedConfigsValidate keeps the example files of README.md and the
// documented config true: each passes `scheduler run --check`.
func TestShippedConfigsValidate(t *testing.T) {
	t.Setenv("SCHEDULER_PG_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	t.Setenv("SCHEDULER_PG_PASSWORD", "pw")
	for _, f := range []string{"examples/three-replicas.yaml", "config.example.yaml"} {
		path, _ := filepath.Abs(filepath.Join("..", "..", f))
		r := run(t, t.TempDir(), "run", "--check", "--config", path)
		if r.code != 0 || !strings.Contains(r.stdout, "configuration ok") {
			t.Errorf("%s: %+v", f, r)
		}
	}
}
