package main_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/job"
)

// TestSeedThenTriggerBilling: the shipped binary's seed command writes demo
// data to the database block, which billing.nightly, opened only by the
// commands that execute it, then invoices.
func TestSeedThenTriggerBilling(t *testing.T) {
	dir := t.TempDir()
	config := writeConfig(t, dir, "claimer:\n  kind: sqlite\n  sqlite:\n    path: ./claims.db\n"+
		"database:\n  kind: sqlite\n  path: ./billing.db\njobs:\n  billing.nightly:\n    schedule: \"@daily\"\n")
	if r := run(t, dir, "help"); r.code != 0 || !strings.Contains(r.stdout, "scheduler seed     [--config FILE] [--customers N] [--days N]") {
		t.Fatalf("help: %+v", r)
	}
	for _, args := range [][]string{{"seed", "--days", "0"}, {"seed", "extra"}} {
		if r := run(t, dir, append(args, "--config", config)...); r.code != 2 || !strings.Contains(r.stderr, "scheduler seed: ") {
			t.Fatalf("%v: %+v", args, r)
		}
	}
	if r := run(t, dir, "seed", "--config", config, "--customers", "3", "--days", "2"); r.code != 0 ||
		!strings.Contains(r.stdout, "seeded 3 customers") || !strings.Contains(r.stdout, "in sqlite ./billing.db") {
		t.Fatalf("seed: %+v", r)
	}
	if r := run(t, dir, "trigger", "--here", "--config", config, "billing.nightly"); r.code != 0 ||
		!strings.Contains(r.stdout, "billing.nightly: succeeded") || !strings.Contains(r.stderr, "customers=3 written=3") {
		t.Fatalf("trigger: %+v", r)
	}
}

// TestOwnBinary is a team's binary: cli.Main with its registry and nothing
// shipped, one job registered with an opener that gets the database block.
func TestOwnBinary(t *testing.T) {
	dir := t.TempDir()
	config := writeConfig(t, dir, "claimer:\n  kind: sqlite\n  sqlite:\n    path: "+filepath.Join(dir, "claims.db")+"\n"+
		"database:\n  kind: sqlite\n  path: "+filepath.Join(dir, "data.db")+"\njobs:\n  reports.hourly:\n    schedule: \"@hourly\"\n")
	var opened []string
	closed := 0
	newReg := func() *job.Registry {
		reg := job.NewRegistry()
		reg.MustRegisterOpener("reports.hourly", func(_ context.Context, res job.Resources) (job.Handler, func() error, error) {
			opened = append(opened, res.Database.String())
			return func(context.Context, job.Run) error { return nil }, func() error { closed++; return nil }, nil
		})
		return reg
	}
	main := func(args ...string) (int, string, string) {
		var o, e bytes.Buffer
		code := cli.Main(args, newReg(), &o, &e)
		return code, o.String(), e.String()
	}
	if code, out, _ := main("help"); code != 0 || strings.Contains(out, "seed") {
		t.Fatalf("help lists seed: %d %s", code, out)
	}
	if code, _, errOut := main("seed"); code != 2 || !strings.Contains(errOut, `unknown command "seed"`) {
		t.Fatalf("seed: %d %s", code, errOut)
	}
	// With a bad schedule beside it: both problems at once, not the
	// handler's after the schedule is fixed.
	bad := writeConfig(t, t.TempDir(), "jobs:\n  example.sleep:\n    schedule: \"@daily\"\n  reports.hourly:\n    schedule: \"* *\"\n")
	if code, _, errOut := main("jobs", "--config", bad); code != 2 || !strings.Contains(errOut, "jobs.example.sleep: no handler registered") ||
		!strings.Contains(errOut, "jobs.reports.hourly.schedule") {
		t.Fatalf("example.sleep is registered in a binary that did not register it, or not said with the bad schedule: %d %s", code, errOut)
	}
	if code, out, _ := main("jobs", "--config", config); code != 0 || !strings.Contains(out, "reports.hourly") || len(opened) != 0 {
		t.Fatalf("jobs: %d %s (opened %v)", code, out, opened)
	}
	if code, out, errOut := main("trigger", "--here", "--config", config, "reports.hourly"); code != 0 || !strings.Contains(out, "reports.hourly: succeeded") {
		t.Fatalf("trigger: %d %s %s", code, out, errOut)
	}
	if want := "sqlite " + filepath.Join(dir, "data.db"); len(opened) != 1 || opened[0] != want || closed != 1 {
		t.Fatalf("opened %q, closed %d times; want [%q] once", opened, closed, want)
	}
}

// TestOwnCommands: a binary's own subcommands get --config, the loaded
// database block and Main's exit codes; Main refuses one it could not tell
// apart from its own.
func TestOwnCommands(t *testing.T) {
	hello := cli.Command{Name: "hello", Synopsis: "[--config FILE] [--fail]", Summary: "say hello",
		Setup: func(fs *flag.FlagSet) cli.Action {
			fail := fs.Bool("fail", false, "fail")
			return func(_ context.Context, in cli.Invocation) error {
				if len(in.Args) > 0 {
					return cli.Usagef("unexpected argument %q", in.Args[0])
				}
				if *fail {
					return errors.New("failed")
				}
				_, err := io.WriteString(in.Stdout, "hello "+in.Resources.Database.Kind+"\n")
				return err
			}
		}}
	dir := t.TempDir()
	config := writeConfig(t, dir, "claimer:\n  kind: sqlite\n  sqlite:\n    path: "+filepath.Join(dir, "claims.db")+"\n")
	main := func(cmds []cli.Command, args ...string) (int, string, string) {
		var o, e bytes.Buffer
		code := cli.Main(args, nil, &o, &e, cmds...)
		return code, o.String(), e.String()
	}
	for _, c := range []struct {
		args          []string
		code          int
		stdout, stder string
	}{
		{[]string{"help"}, 0, "  scheduler hello    [--config FILE] [--fail]  say hello\n  scheduler version\n", ""},
		{[]string{"hello", "--config", config}, 0, "hello sqlite\n", ""},
		{[]string{"hello", "--config", config, "--fail"}, 1, "", "scheduler: failed\n"},
		{[]string{"hello", "--config", config, "x"}, 2, "", "scheduler hello: unexpected argument \"x\"\n"},
		{[]string{"hello", "--nope"}, 2, "", "Usage: scheduler hello [--config FILE] [--fail]"},
		{[]string{"hello", "--help"}, 0, "", "Usage: scheduler hello [--config FILE] [--fail]"},
	} {
		code, out, errOut := main([]cli.Command{hello}, c.args...)
		if code != c.code || !strings.Contains(out, c.stdout) || !strings.Contains(errOut, c.stder) {
			t.Errorf("%v: %d %q %q; want %d, %q, %q", c.args, code, out, errOut, c.code, c.stdout, c.stder)
		}
	}
	for _, cmds := range [][]cli.Command{
		{{Name: "run", Setup: hello.Setup}}, {{Name: "version", Setup: hello.Setup}}, {{Name: "help", Setup: hello.Setup}},
		{hello, hello}, {{Name: "", Setup: hello.Setup}}, {{Name: "nosetup"}},
		// A Setup that returns no Action, or declares --config again,
		// is refused up front, not found by a panic when run (an
		// outside review).
		{{Name: "noaction", Setup: func(*flag.FlagSet) cli.Action { return nil }}},
		{{Name: "config", Setup: func(fs *flag.FlagSet) cli.Action { fs.String("config", "", ""); return hello.Setup(fs) }}},
	} {
		if code, _, errOut := main(cmds, "version"); code != 2 || !strings.HasPrefix(errOut, "scheduler: command ") || strings.Contains(errOut, "goroutine") {
			t.Errorf("%q accepted: %d %s", cmds[0].Name, code, errOut)
		}
	}
}
