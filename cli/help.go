package cli

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// examples are the lines `scheduler COMMAND --help` ends with.
var examples = map[string][]string{
	"run": {
		"scheduler run                                   # embedded SQLite ./scheduler.db",
		"scheduler run --config /etc/scheduler/config.yaml",
		"scheduler run --config config.yaml --check      # validate and exit",
	},
	"migrate": {"scheduler migrate up --config config.yaml", "scheduler migrate status --config config.yaml"},
	"jobs":    {"scheduler jobs --config config.yaml", "scheduler jobs --config config.yaml --json"},
	"runs":    {"scheduler runs --config config.yaml --job billing.nightly --limit 50"},
	"pause": {
		`scheduler pause billing.nightly --note "migrating invoices" --config config.yaml`,
		`scheduler pause --all --note "incident 4711" --config config.yaml`,
	},
	"resume": {"scheduler resume billing.nightly --config config.yaml", "scheduler resume --all --config config.yaml"},
	"trigger": {
		`scheduler trigger billing.nightly --note "rerun after fix" --request-id fix-4711 --wait --config config.yaml`,
		"scheduler trigger billing.nightly --here --config config.yaml   # in this process",
	},
	"backfill": {
		"scheduler backfill billing.nightly --from 2026-11-01 --to 2026-11-30 --dry-run --config config.yaml",
		"scheduler backfill billing.nightly --from 2026-11-01 --to 2026-11-30 --rerun failed --max-concurrent 4 --config config.yaml",
	},
	"compare": {
		"scheduler compare --claimers memory,sqlite --faults none,crash --duration 30s",
		"scheduler compare --faults random --seed 42 --html report.html",
	},
	"prune":      {"scheduler prune --older-than 720h --config config.yaml"},
	"completion": {"source <(scheduler completion bash)", "scheduler completion zsh > \"${fpath[1]}/_scheduler\""},
}

// printExamples ends a command's help with its examples, if it has any.
func (e *env) printExamples(w io.Writer, name string) {
	ex := examples[name]
	for _, c := range e.cmds {
		if c.Name == name && c.Example != "" {
			ex = strings.Split(strings.TrimSpace(c.Example), "\n")
		}
	}
	if len(ex) == 0 {
		return
	}
	fmt.Fprintln(w, "\nExamples:")
	for _, l := range ex {
		fmt.Fprintln(w, "  "+l)
	}
}

// completion prints a completion script for bash or zsh: the commands and,
// for each, its flags, learned from the flag sets the commands declare.
func (e *env) completion(args []string) int {
	fs := flag.NewFlagSet("completion", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: scheduler completion bash|zsh")
		e.printExamples(fs.Output(), "completion")
	}
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 || (fs.Arg(0) != "bash" && fs.Arg(0) != "zsh") {
		fmt.Fprintln(e.stderr, "scheduler completion: want bash or zsh")
		fs.Usage()
		return ExitUsage
	}
	script := bashCompletion(e.commandFlags())
	if fs.Arg(0) == "zsh" {
		// zsh runs bash completion functions through bashcompinit.
		script = "#compdef scheduler\nautoload -U +X bashcompinit && bashcompinit\n" + script
	}
	fmt.Fprint(e.stdout, script)
	return ExitOK
}

// commandFlags maps every command to its flags (--name), asking each
// command to declare its flag set without running.
func (e *env) commandFlags() map[string][]string {
	out := map[string][]string{"version": nil, "help": nil}
	names := append(slices.Clone(builtins), commandNames(e.cmds)...)
	for _, name := range names {
		var flags []string
		probe := &env{reg: e.reg, stdout: io.Discard, stderr: io.Discard, cmds: e.cmds, usage: e.usage,
			declared: func(fs *flag.FlagSet) {
				fs.VisitAll(func(f *flag.Flag) { flags = append(flags, "--"+f.Name) })
			}}
		probe.dispatch(name, nil)
		slices.Sort(flags)
		out[name] = append(flags, "--help")
	}
	return out
}

func commandNames(cmds []Command) []string {
	var out []string
	for _, c := range cmds {
		out = append(out, c.Name)
	}
	return out
}

// bashCompletion renders the script: the command at the first word, then
// that command's flags; anything else (a JOB, a FILE) falls back to file
// names (-o default).
func bashCompletion(flags map[string][]string) string {
	var names []string
	for n := range flags {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("# scheduler completion; load with: source <(scheduler completion bash)\n")
	b.WriteString("_scheduler() {\n")
	b.WriteString("  local cur=\"${COMP_WORDS[COMP_CWORD]}\" opts=\"\"\n")
	b.WriteString("  if [ \"$COMP_CWORD\" -eq 1 ]; then\n")
	fmt.Fprintf(&b, "    COMPREPLY=($(compgen -W %q -- \"$cur\"))\n", strings.Join(names, " "))
	b.WriteString("    return\n  fi\n")
	b.WriteString("  case \"${COMP_WORDS[1]}\" in\n")
	for _, n := range names {
		fmt.Fprintf(&b, "    %s) opts=%q ;;\n", n, strings.Join(flags[n], " "))
	}
	b.WriteString("  esac\n")
	b.WriteString("  case \"$cur\" in\n    -*) COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\")) ;;\n    *) COMPREPLY=() ;;\n  esac\n")
	b.WriteString("}\ncomplete -o default -F _scheduler scheduler\n")
	return b.String()
}
