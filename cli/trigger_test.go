package cli_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/job"
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

// A --wait with a timeout that has run out before it starts is bad
// usage, refused before the request is sent: it once exited 1 with the
// run already queued behind it (outside review).
func TestTriggerWaitRefusesATimeoutThatIsNotPositive(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n")
	defer b.Close()
	for _, d := range []string{"0s", "-1s"} {
		code, out, errOut := mainIn(t, dir, "trigger", "--wait", "--timeout", d, "--config", path, "example.sleep")
		if code != cli.ExitUsage || !strings.Contains(errOut, "--timeout "+d) || out != "" {
			t.Errorf("trigger --wait --timeout %s: exit %d, stdout %q, stderr %q; want %d naming the flag", d, code, out, errOut, cli.ExitUsage)
		}
	}
	reqs, err := control.New(b.Controls, nil).Requests(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 0 {
		t.Errorf("the refused triggers left %d requests queued: %+v", len(reqs), reqs)
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
	// No replica runs: the request waits, and the command says so.
	code, out, errOut := mainIn(t, dir, "trigger", "--request-id", "k-wait", "--wait", "--timeout", "300ms", "--config", path, "example.sleep")
	if !strings.Contains(out, "no replica is up now: it runs if one starts within 1h0m0s") {
		t.Errorf("trigger with no replica up: stdout %q, want it to say so, and for how long the request stays", out)
	}
	if code != cli.ExitRuntime || !strings.Contains(out, "(request k-wait)") ||
		!strings.Contains(errOut, "request k-wait stays queued") || !strings.Contains(errOut, "scheduler trigger --config "+path+" --request-id k-wait --wait example.sleep") {
		t.Fatalf("trigger --wait past its timeout: exit %d, stdout %q, stderr %q; want %d, the request said queued and how to wait again", code, out, errOut, cli.ExitRuntime)
	}
	// The suggested command, with a timeout, from another directory:
	// its --config names the same backend.
	code, out, errOut = mainIn(t, t.TempDir(), "trigger", "--config", path, "--request-id", "k-wait", "--wait", "--timeout", "300ms", "example.sleep")
	if code != cli.ExitRuntime || !strings.Contains(out, "request k-wait already made") {
		t.Fatalf("the suggested command: exit %d, stdout %q, stderr %q; want the request found already made", code, out, errOut)
	}
}

// A request nobody picked up within its window (the larger of
// misfire.grace and the late tolerance) is never run: --wait past it says
// so, rather than that the fleet will still run it. Found by an outside
// review.
func TestTriggerWaitPastTheRequestsWindowSaysItWillNotRun(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n    misfire:\n      grace: 1s\n")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// The late tolerance: 2×100ms + 5s.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(raw), "claimer:\n", "claimer:\n  max_clock_skew: 100ms\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := mainIn(t, dir, "trigger", "--wait", "--timeout", "6s", "--config", path, "example.sleep")
	if code != cli.ExitRuntime || strings.Contains(errOut, "the fleet will still run it") || !strings.Contains(errOut, "no replica will run it now") {
		t.Fatalf("trigger --wait past the request's window: exit %d, stderr %q; want %d and that no replica will run it", code, errOut, cli.ExitRuntime)
	}
}

// A request id names one request: reusing it for another job runs
// nothing, so it is an error, not "already made" (the API answers 409).
// Found by an outside review.
func TestTriggerWithAnotherJobsRequestIDFails(t *testing.T) {
	dir, path, b := sqliteBackend(t, "  example.sleep:\n    schedule: \"@daily\"\n  other.job:\n    schedule: \"@daily\"\n")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	reg := job.NewRegistry()
	reg.MustRegister("example.sleep", func(context.Context, job.Run) error { return nil })
	reg.MustRegister("other.job", func(context.Context, job.Run) error { return nil })
	trigger := func(name string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := cli.Main([]string{"trigger", "--request-id", "k1", "--config", path, name}, reg, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	if code, out, errOut := trigger("example.sleep"); code != cli.ExitOK {
		t.Fatalf("first trigger: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, errOut := trigger("example.sleep"); code != cli.ExitOK || !strings.Contains(out, "already made") {
		t.Fatalf("the same trigger again: exit %d, stdout %q, stderr %q; want it found already made", code, out, errOut)
	}
	code, out, errOut := trigger("other.job")
	if code != cli.ExitRuntime || !strings.Contains(errOut, "already made for job example.sleep") {
		t.Fatalf("trigger other.job under example.sleep's request id: exit %d, stdout %q, stderr %q; want %d naming the job the id is taken by",
			code, out, errOut, cli.ExitRuntime)
	}
}
