package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/cli"
)

// Input an operator gets wrong is refused with exit 2 and a message that
// names what was wrong, not ignored nor taken for something else (each
// case was found by an outside review, accepted or exiting 1).
func TestOperatorMistakesAreUsageErrors(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	empty, comments := filepath.Join(dir, "empty.yaml"), filepath.Join(dir, "comments.yaml")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(comments, []byte("# jobs: to come\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		// An empty or truncated file (a ConfigMap mounted before it was
		// written) would start a replica that runs nothing.
		{[]string{"run", "--check", "--config", empty}, "empty.yaml: is empty"},
		{[]string{"run", "--check", "--config", comments}, "comments.yaml: is empty"},
		// Below the floor no config helps: the floor is named first.
		{[]string{"prune", "--config", path, "--older-than", "0s"}, "must be at least 48h0m0s whatever the config says"},
		// A templated --config "$CONFIG" whose variable is unset would
		// start the built-in default, a fleet of its own.
		{[]string{"run", "--config", ""}, "--config is empty"},
		{[]string{"jobs", "--config", ""}, "--config is empty"},
		// Arguments of commands that take flags only: `runs billing`
		// meant --job billing.
		{[]string{"runs", "--config", path, "example.sleep"}, `unexpected argument "example.sleep"`},
		{[]string{"jobs", "--config", path, "extra"}, `unexpected argument "extra"`},
		{[]string{"prune", "--config", path, "extra"}, `unexpected argument "extra"`},
		{[]string{"version", "extra"}, `unexpected argument "extra"`},
		// trigger has no --all to offer.
		{[]string{"trigger", "--config", path}, "want exactly one JOB\n"},
		// A backfill's range reversed, or reaching into the future.
		{[]string{"backfill", "--config", path, "--from", "2026-11-02", "--to", "2026-11-01", "example.sleep"}, "is before --from"},
		{[]string{"backfill", "--config", path, "--from", "2026-11-01", "--to", "2999-01-01", "example.sleep"}, "is in the future"},
		// The API's limits on free text hold on the command line too.
		{[]string{"pause", "--config", path, "--note", strings.Repeat("x", 1025), "example.sleep"}, "--note: longer than 1024 bytes"},
		{[]string{"trigger", "--config", path, "--by", "a\x1bb", "example.sleep"}, "--by: contains a control character"},
		{[]string{"trigger", "--config", path, "--request-id", strings.Repeat("k", 201), "example.sleep"}, "--request-id: longer than 200 bytes"},
	} {
		code, out, errOut := mainIn(t, dir, tc.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d and %q", tc.args, code, out, errOut, cli.ExitUsage, tc.want)
		}
	}
}
