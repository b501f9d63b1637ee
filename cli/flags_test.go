package cli_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/job"
)

// mainIn runs cli.Main in dir with a registry holding example.sleep and a
// command of the binary's own, hello.
func mainIn(t *testing.T, dir string, args ...string) (int, string, string) {
	t.Helper()
	t.Chdir(dir)
	reg := job.NewRegistry()
	reg.MustRegister("example.sleep", func(context.Context, job.Run) error { return nil })
	hello := cli.Command{Name: "hello", Synopsis: "[--config FILE] [--loud] NAME", Summary: "greets NAME",
		Example: "scheduler hello world --loud",
		Setup: func(fs *flag.FlagSet) cli.Action {
			loud := fs.Bool("loud", false, "shout")
			return func(_ context.Context, in cli.Invocation) error {
				if len(in.Args) != 1 {
					return cli.Usagef("want one NAME, got %q", in.Args)
				}
				msg := "hello " + in.Args[0]
				if *loud {
					msg = strings.ToUpper(msg)
				}
				_, err := in.Stdout.Write([]byte(msg + "\n"))
				return err
			}
		}}
	var out, errOut bytes.Buffer
	code := cli.Main(args, reg, &out, &errOut, hello)
	return code, out.String(), errOut.String()
}

// Every subcommand reads its flags before, after and between its
// arguments, and "--" ends them: each row's argument orders must give the
// same exit code and output.
func TestEverySubcommandReadsFlagsInAnyOrder(t *testing.T) {
	dir := t.TempDir()
	const cfg = "config.yaml"
	if err := os.WriteFile(filepath.Join(dir, cfg), []byte("claimer:\n  kind: sqlite\n  sqlite:\n    path: ./claims.db\n"+
		"http:\n  addr: \"\"\nlog:\n  level: error\njobs:\n  example.sleep:\n    schedule: \"@daily\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "compare.json")
	rows := []struct {
		name   string
		orders [][]string
		want   string // in stdout, or in stderr when code is not 0
		code   int
	}{
		{"run", [][]string{{"run", "--check", "--config", cfg}, {"run", "--config", cfg, "--check"}}, "configuration ok", 0},
		{"jobs", [][]string{{"jobs", "--json", "--config", cfg}, {"jobs", "--config", cfg, "--json"}}, `"name": "example.sleep"`, 0},
		{"trigger --here", [][]string{{"trigger", "example.sleep", "--here", "--config", cfg}, {"trigger", "--here", "--config", cfg, "example.sleep"}, {"trigger", "--here", "--config", cfg, "--", "example.sleep"}}, "example.sleep: succeeded", 0},
		// After trigger --here, which created the file they read.
		{"runs", [][]string{{"runs", "--job", "example.sleep", "--limit", "5", "--config", cfg}, {"runs", "--config", cfg, "--limit", "5", "--job", "example.sleep"}}, "JOB", 0},
		{"migrate", [][]string{{"migrate", "status", "--config", cfg}, {"migrate", "--config", cfg, "status"}, {"migrate", "--config", cfg, "--", "status"}}, "00001_create_runs.sql", 0},
		{"pause", [][]string{{"pause", "example.sleep", "--note", "n", "--by", "me", "--config", cfg}, {"pause", "--by", "me", "--note", "n", "--config", cfg, "example.sleep"}}, "example.sleep paused by me", 0},
		{"pause --all", [][]string{{"pause", "--all", "--by", "me", "--config", cfg}, {"pause", "--config", cfg, "--by", "me", "--all"}}, "every job paused by me", 0},
		{"resume", [][]string{{"resume", "example.sleep", "--by", "me", "--config", cfg}, {"resume", "--config", cfg, "--by", "me", "example.sleep"}}, "example.sleep resumed by me", 0},
		{"backfill", [][]string{
			{"backfill", "example.sleep", "--from", "2026-01-01", "--to", "2026-01-03", "--dry-run", "--json", "--config", cfg},
			{"backfill", "--dry-run", "--json", "--config", cfg, "--from", "2026-01-01", "example.sleep", "--to", "2026-01-03"},
		}, `"planned": 3`, 0},
		{"prune", [][]string{{"prune", "--older-than", "72h", "--config", cfg}, {"prune", "--config", cfg, "--older-than", "72h"}}, "pruned 0 finished runs", 0},
		// compare takes no arguments; a usage error that names two of its
		// flags' values shows both were read in either order, in no time.
		{"compare", [][]string{
			{"compare", "--claimers", "memory", "--faults", "none", "--duration", "1s", "--lease", "300ms", "--json", report},
			{"compare", "--json", report, "--lease", "300ms", "--duration", "1s", "--faults", "none", "--claimers", "memory"},
		}, "--duration 1s: too short for --lease 300ms", cli.ExitUsage},
		{"completion", [][]string{{"completion", "bash"}, {"completion", "--", "bash"}}, "complete -o default -F _scheduler scheduler", 0},
		{"own command", [][]string{{"hello", "world", "--loud", "--config", cfg}, {"hello", "--loud", "--config", cfg, "world"}}, "HELLO WORLD", 0},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var first string
			for i, args := range row.orders {
				code, out, errOut := mainIn(t, dir, args...)
				if row.code != cli.ExitOK {
					out = errOut
				}
				if code != row.code || !strings.Contains(out, row.want) {
					t.Fatalf("%q: exit %d, stdout %q, stderr %q; want exit %d and %q", args, code, out, errOut, row.code, row.want)
				}
				if strings.HasPrefix(row.name, "pause") || row.name == "resume" {
					continue // the switch's time differs between runs
				}
				if i == 0 {
					first = out
				} else if out != first {
					t.Fatalf("%q printed\n%s\nbut %q printed\n%s", row.orders[0], first, args, out)
				}
			}
		})
	}
}

// A flag after the arguments is still checked: unknown flags and missing
// values are usage errors naming the flag.
func TestFlagsAfterArgumentsAreStillChecked(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pause", "example.sleep", "--nope"}, "-nope"},
		{[]string{"trigger", "example.sleep", "--request-id"}, "-request-id"},
		{[]string{"hello", "world", "--quiet"}, "-quiet"},
	} {
		code, _, errOut := mainIn(t, dir, tc.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 naming %s", tc.args, code, errOut, tc.want)
		}
	}
}

// Every command's --help shows its usage and ends with an example.
// version --help is its usage, exit 0, as every other command's.
func TestVersionHelpIsUsage(t *testing.T) {
	for _, flag := range []string{"--help", "-h"} {
		if code, _, errOut := mainIn(t, t.TempDir(), "version", flag); code != cli.ExitOK || !strings.Contains(errOut, "Usage: scheduler version") {
			t.Errorf("version %s: exit %d, %q", flag, code, errOut)
		}
	}
	if code, _, _ := mainIn(t, t.TempDir(), "version", "extra"); code != cli.ExitUsage {
		t.Errorf("version extra: exit %d, want %d", code, cli.ExitUsage)
	}
}

func TestEveryHelpShowsAnExample(t *testing.T) {
	dir := t.TempDir()
	for _, cmd := range []string{"run", "migrate", "jobs", "runs", "pause", "resume", "trigger", "backfill", "compare", "prune", "completion", "hello"} {
		code, _, errOut := mainIn(t, dir, cmd, "--help")
		if code != cli.ExitOK || !strings.Contains(errOut, "Usage: scheduler "+cmd) || !strings.Contains(errOut, "Examples:\n  scheduler ") &&
			!strings.Contains(errOut, "Examples:\n  source <(scheduler") {
			t.Errorf("%s --help: exit %d\n%s", cmd, code, errOut)
		}
	}
}

// The bash completion script parses, completes commands and each
// command's flags, and the zsh one loads it through bashcompinit.
func TestCompletion(t *testing.T) {
	dir := t.TempDir()
	code, script, errOut := mainIn(t, dir, "completion", "bash")
	if code != cli.ExitOK {
		t.Fatalf("completion bash: %d %s", code, errOut)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	complete := func(words ...string) string {
		t.Helper()
		prog := script + "\nCOMP_WORDS=(" + strings.Join(words, " ") + ")\nCOMP_CWORD=" +
			string(rune('0'+len(words)-1)) + "\n_scheduler\necho \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command(bash, "-c", prog).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"scheduler", "pa"}, "pause"},
		{[]string{"scheduler", "re"}, "resume"},
		{[]string{"scheduler", "h"}, "hello help"},
		{[]string{"scheduler", "backfill", "--fr"}, "--from"},
		{[]string{"scheduler", "trigger", "--re"}, "--request-id"},
		{[]string{"scheduler", "hello", "--l"}, "--loud"},
	} {
		if got := complete(tc.words...); got != tc.want {
			t.Errorf("%v: completed %q, want %q", tc.words, got, tc.want)
		}
	}
	code, zsh, _ := mainIn(t, dir, "completion", "zsh")
	if code != cli.ExitOK || !strings.HasPrefix(zsh, "#compdef scheduler\n") || !strings.Contains(zsh, "bashcompinit") || !strings.Contains(zsh, script) {
		t.Fatalf("completion zsh: %d\n%s", code, zsh)
	}
	if code, _, errOut := mainIn(t, dir, "completion", "fish"); code != cli.ExitUsage || !strings.Contains(errOut, "bash or zsh") {
		t.Fatalf("completion fish: %d %s", code, errOut)
	}
}
