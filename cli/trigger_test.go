package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/internal/claim"
)

// `trigger --here` obeys the job's overlap policy, and runs beside a live
// earlier run with --overlap allow, as a request to the fleet does (the
// flag was ignored with --here); --request-id, a request's key, is refused
// with --here, which makes no request.
func TestTriggerHereHonoursOverlapAllow(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	ctx := t.Context()
	// Today's run is live, held by a replica for the next hour.
	live := claim.Run{Job: "example.sleep", At: time.Now().UTC().Truncate(24 * time.Hour)}
	if _, err := claim.ClaimOne(ctx, b, live, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	if code, out, errOut := mainIn(t, dir, "trigger", "--here", "--config", path, "example.sleep"); code != cli.ExitRuntime ||
		!strings.Contains(out, "example.sleep: skipped") {
		t.Errorf("trigger --here beside a live run of a forbid job: exit %d, stdout %q, stderr %q; want %d, skipped", code, out, errOut, cli.ExitRuntime)
	}
	if code, out, errOut := mainIn(t, dir, "trigger", "--here", "--overlap", "allow", "--config", path, "example.sleep"); code != cli.ExitOK ||
		!strings.Contains(out, "example.sleep: succeeded") {
		t.Errorf("trigger --here --overlap allow: exit %d, stdout %q, stderr %q; want 0, succeeded", code, out, errOut)
	}
	if code, out, errOut := mainIn(t, dir, "trigger", "--here", "--request-id", "k1", "--config", path, "example.sleep"); code != cli.ExitUsage ||
		!strings.Contains(errOut, `--request-id "k1"`) || out != "" {
		t.Errorf("trigger --here --request-id: exit %d, stdout %q, stderr %q; want %d naming the flag", code, out, errOut, cli.ExitUsage)
	}
}

// --timeout bounds --wait: said without it, or with --here (which runs
// the job to its end), it is refused rather than dropped without a word.
func TestTriggerTimeoutNeedsWait(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"trigger", "--timeout", "5s", "--config", path, "example.sleep"},
		{"trigger", "--here", "--wait", "--timeout", "5s", "--config", path, "example.sleep"},
	} {
		if code, out, errOut := mainIn(t, dir, args...); code != cli.ExitUsage || !strings.Contains(errOut, "--timeout 5s") || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d naming the flag", args, code, out, errOut, cli.ExitUsage)
		}
	}
}

// A --wait that times out leaves the request queued: the message says so
// and how to wait again without a second run (the same --request-id),
// which finds the request already made rather than making another.
func TestTriggerWaitTimeoutSaysTheRequestStays(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// No replica runs: the request waits.
	code, out, errOut := mainIn(t, dir, "trigger", "--request-id", "k-wait", "--wait", "--timeout", "300ms", "--config", path, "example.sleep")
	if code != cli.ExitRuntime || !strings.Contains(out, "(request k-wait)") ||
		!strings.Contains(errOut, "request k-wait stays queued") || !strings.Contains(errOut, "scheduler trigger --request-id k-wait --wait example.sleep") {
		t.Fatalf("trigger --wait past its timeout: exit %d, stdout %q, stderr %q; want %d, the request said queued and how to wait again", code, out, errOut, cli.ExitRuntime)
	}
	code, out, errOut = mainIn(t, dir, "trigger", "--request-id", "k-wait", "--wait", "--timeout", "300ms", "--config", path, "example.sleep")
	if code != cli.ExitRuntime || !strings.Contains(out, "request k-wait already made") {
		t.Fatalf("the suggested command: exit %d, stdout %q, stderr %q; want the request found already made", code, out, errOut)
	}
}
