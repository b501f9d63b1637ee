package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/internal/jobs"
	"github.com/scheduler-dev/scheduler/internal/jobs/billing"
	"github.com/scheduler-dev/scheduler/job"
)

// paramsMain runs cli.Main in a fresh directory on a config.yaml with the
// given jobs block, with the shipped jobs registered as cmd/scheduler does,
// and a job "counted" whose typed handler counts its runs, and one "free"
// that declares no params.
func paramsMain(t *testing.T, jobsYAML string, ran *atomic.Int32, args ...string) (int, string, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	body := "claimer:\n  kind: sqlite\n  sqlite:\n    path: " + filepath.Join(dir, "claims.db") + "\n" +
		"http:\n  addr: \"\"\nlog:\n  level: error\njobs:\n" + jobsYAML
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := job.NewRegistry()
	job.MustRegisterTyped(reg, jobs.SleepName, jobs.Sleep)
	reg.MustRegisterOpener(billing.JobName, billing.Opener, job.WithParams[billing.Params]())
	job.MustRegisterTyped(reg, "counted", func(context.Context, job.Run, jobs.SleepParams) error { ran.Add(1); return nil })
	reg.MustRegister("free", func(context.Context, job.Run) error { return nil })
	var out, errOut bytes.Buffer
	code := cli.Main(append(args, "--config", cfg), reg, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCommandsCheckParamsBeforeRunning(t *testing.T) {
	const bad = `  example.sleep:
    schedule: "@daily"
    params: {duration: forever}
`
	t.Run("RunCheckRejectsABadValue", func(t *testing.T) {
		var ran atomic.Int32
		code, out, errOut := paramsMain(t, bad, &ran, "run", "--check")
		want := `config.yaml: jobs.example.sleep.params.duration: "forever": want a duration such as "1s"`
		if code != cli.ExitUsage || !strings.Contains(errOut, want) || strings.Contains(out, "configuration ok") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want %d naming %s", code, out, errOut, cli.ExitUsage, want)
		}
	})
	t.Run("RunCheckReportsEveryProblem", func(t *testing.T) {
		var ran atomic.Int32
		code, _, errOut := paramsMain(t, bad+`  billing.nightly:
    schedule: "@daily"
    params: {period: yesterday, currency: EUR}
`, &ran, "run", "--check")
		for _, want := range []string{
			`jobs.example.sleep.params.duration: "forever"`,
			`jobs.billing.nightly.params.period: "yesterday": want a date`,
			`jobs.billing.nightly.params.currency: unknown key; want one of pace, period`,
		} {
			if code != cli.ExitUsage || !strings.Contains(errOut, want) {
				t.Errorf("exit %d, stderr %q; want %d naming %s", code, errOut, cli.ExitUsage, want)
			}
		}
	})
	t.Run("RunCheckAcceptsValidParams", func(t *testing.T) {
		var ran atomic.Int32
		code, out, errOut := paramsMain(t, `  example.sleep:
    schedule: "@daily"
    params: {duration: 1s}
  billing.nightly:
    schedule: "@daily"
    params: {period: 2026-01-31, pace: 10ms}
  free:
    schedule: "@daily"
    params: {anything: [1, {goes: true}]}
`, &ran, "run", "--check")
		if code != cli.ExitOK || !strings.Contains(out, "configuration ok") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
	t.Run("DisabledJobIsNotChecked", func(t *testing.T) {
		var ran atomic.Int32
		code, out, errOut := paramsMain(t, bad+"    enabled: false\n", &ran, "run", "--check")
		if code != cli.ExitOK || !strings.Contains(out, "0 jobs enabled") || !strings.Contains(out, "claims nothing") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
	t.Run("TriggerHereRunsNothing", func(t *testing.T) {
		var ran atomic.Int32
		code, _, errOut := paramsMain(t, `  counted:
    schedule: "@daily"
    params: {duration: 1s, extra: 1}
`, &ran, "trigger", "--here", "counted")
		if code != cli.ExitUsage || !strings.Contains(errOut, "jobs.counted.params.extra: unknown key") || ran.Load() != 0 {
			t.Fatalf("exit %d, stderr %q, %d runs", code, errOut, ran.Load())
		}
	})
	t.Run("TriggerHereRunsValidParams", func(t *testing.T) {
		var ran atomic.Int32
		code, out, errOut := paramsMain(t, `  counted:
    schedule: "@daily"
    params: {duration: 1s}
`, &ran, "trigger", "--here", "counted")
		if code != cli.ExitOK || ran.Load() != 1 {
			t.Fatalf("exit %d, stdout %q, stderr %q, %d runs", code, out, errOut, ran.Load())
		}
	})
	t.Run("BackfillRejectsABadValue", func(t *testing.T) {
		var ran atomic.Int32
		code, _, errOut := paramsMain(t, bad, &ran, "backfill", "--from", "2026-01-01", "--to", "2026-01-02", "example.sleep")
		if code != cli.ExitUsage || !strings.Contains(errOut, "jobs.example.sleep.params.duration") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})
}
