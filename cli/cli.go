// Package cli is the scheduler's command line. cmd/scheduler calls Main with
// the shipped handlers; a team's own binary registers its handlers in a
// job.Registry and calls Main the same way, getting the same runtime.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	_ "time/tzdata" // time zones resolve on minimal images without /usr/share/zoneinfo

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/job"
	"github.com/scheduler-dev/scheduler/migrations"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitRuntime = 1
	ExitUsage   = 2
)

// Version is set at build time with -ldflags "-X …/cli.Version=v1.2.3".
var Version = ""

const usage = `scheduler: a cron job runner for replicated deployments.

Usage:
  scheduler run      [--config FILE] [--check]  run the replica (no config: embedded sqlite ./scheduler.db)
  scheduler migrate  [--config FILE] [--yes] up|down|status
  scheduler jobs     [--config FILE] [--json]   registered jobs, schedules, next instants
  scheduler runs     [--config FILE] [--job J] [--limit N] [--attempts] [--json]
  scheduler pause    [--config FILE] [--note TEXT] [--by WHO] JOB|--all   skip JOB's instants on every replica until resumed
  scheduler resume   [--config FILE] [--note TEXT] [--by WHO] JOB|--all
  scheduler trigger  [--config FILE] [--note TEXT] [--by WHO] [--request-id ID] [--overlap allow] [--wait [--timeout D]] [--here] JOB   ask the fleet to run JOB now, once
  scheduler backfill [--config FILE] --from T --to T [--rerun none|failed|skipped|all] [--max-concurrent N] [--newest-first] [--dry-run] [--json] JOB
  scheduler compare  [--claimers a,b] [--faults pause,crash,…] [--json F] [--html F]  claim strategies side by side under faults
  scheduler prune    [--config FILE] [--older-than 720h]   delete old finished runs (SQL claimers)
  scheduler completion bash|zsh   shell completion script
  scheduler version

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or invalid config.
Flags go before or after a command's arguments.
Run "scheduler COMMAND --help" for a command's flags and examples.
`

// Main runs the command line with args (without the program name) and
// returns the exit code. reg holds every job the binary can run (Main adds
// none; nil is an empty registry), cmds the binary's own subcommands.
func Main(args []string, reg *job.Registry, stdout, stderr io.Writer, cmds ...Command) int {
	if reg == nil {
		reg = job.NewRegistry()
	}
	if err := checkCommands(cmds); err != nil {
		fmt.Fprintln(stderr, "scheduler:", err)
		return ExitUsage
	}
	usage := usageWith(cmds)
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	e := &env{reg: reg, stdout: stdout, stderr: stderr, cmds: cmds, usage: usage}
	return e.dispatch(args[0], args[1:])
}

// builtins are Main's own commands with flags, in usage order.
var builtins = []string{"run", "migrate", "jobs", "runs", "pause", "resume", "trigger", "backfill", "compare", "prune", "completion"}

// dispatch runs command cmd with args.
func (e *env) dispatch(cmd string, rest []string) int {
	switch cmd {
	case "run":
		return e.run(rest)
	case "migrate":
		return e.migrate(rest)
	case "jobs":
		return e.jobs(rest)
	case "runs":
		return e.runs(rest)
	case "trigger":
		return e.trigger(rest)
	case "pause":
		return e.pause(rest)
	case "resume":
		return e.resume(rest)
	case "backfill":
		return e.backfill(rest)
	case "prune":
		return e.prune(rest)
	case "compare":
		return e.compare(rest)
	case "completion":
		return e.completion(rest)
	case "version", "--version":
		if len(rest) == 1 && (rest[0] == "-h" || rest[0] == "--help" || rest[0] == "-help") {
			// As every other command's --help: its usage, exit 0.
			fmt.Fprintln(e.stderr, "Usage: scheduler version\n\nPrints the version of this binary.")
			return ExitOK
		}
		if len(rest) > 0 {
			fmt.Fprintf(e.stderr, "scheduler version: unexpected argument %q\n", rest[0])
			return ExitUsage
		}
		fmt.Fprintln(e.stdout, "scheduler", version())
		return ExitOK
	case "help", "-h", "--help":
		fmt.Fprint(e.stdout, e.usage)
		return ExitOK
	}
	for _, c := range e.cmds {
		if c.Name == cmd {
			return e.command(c, rest)
		}
	}
	fmt.Fprintf(e.stderr, "scheduler: unknown command %q\n\n%s", cmd, e.usage)
	return ExitUsage
}

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// env is what every command shares.
type env struct {
	reg            *job.Registry
	stdout, stderr io.Writer
	cmds           []Command // the binary's own
	usage          string
	// declared, when set, receives each command's flag set instead of
	// the command running: completion learns the flags from it.
	declared func(*flag.FlagSet)
}

// flags returns a FlagSet with --config, whose errors go to stderr.
func (e *env) flags(name, synopsis string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: scheduler %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
		e.printExamples(fs.Output(), name)
	}
	path := fs.String("config", "", "YAML config `FILE` (default: built-in sqlite ./scheduler.db)")
	return fs, path
}

// parse parses flags before or after the arguments (`scheduler pause
// billing --note x` as well as `scheduler pause --note x billing`); "--"
// ends the flags. It returns an exit code and false when the command
// should stop (help requested, bad usage, or flags only declared).
func (e *env) parse(fs *flag.FlagSet, args []string) (int, bool) {
	if e.declared != nil {
		e.declared(fs)
		return ExitOK, false
	}
	if err := fs.Parse(interspersed(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK, false
		}
		return ExitUsage, false
	}
	// --config "" is a templated --config "$CONFIG" whose variable is not
	// set: the built-in default in its place would start a replica of
	// its own on ./scheduler.db, beside the fleet it was meant to join.
	if f := fs.Lookup("config"); f != nil && f.Value.String() == "" && visited(fs, "config") {
		fmt.Fprintf(e.stderr, "scheduler %s: --config is empty (an unset variable?); leave it out for the built-in default\n", fs.Name())
		return ExitUsage, false
	}
	return 0, true
}

// parseNoArgs is parse for a command that takes flags only: an argument
// is an error (\`scheduler runs billing\` meant --job billing), not
// ignored.
func (e *env) parseNoArgs(fs *flag.FlagSet, args []string) (int, bool) {
	code, ok := e.parse(fs, args)
	if ok && fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "scheduler %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return ExitUsage, false
	}
	return code, ok
}

// visited reports whether the flag name was set on the command line.
func visited(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// interspersed moves the flags among args ahead of the arguments, so that
// flag.Parse, which stops at the first argument, reads them all.
func interspersed(fs *flag.FlagSet, args []string) []string {
	var flags, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			rest = append(rest, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // flag.Parse reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !(ok && b.IsBoolFlag()) {
			if i+1 == len(args) {
				return flags // its value is missing: flag.Parse says so
			}
			flags = append(flags, args[i+1]) // the flag's value
			i++
		}
	}
	if len(rest) == 0 {
		return flags
	}
	return append(append(flags, "--"), rest...)
}

// load reads and validates the config against the registry; on error it
// reports every problem and returns false.
func (e *env) load(path string) (*config.Config, bool) {
	var cfg *config.Config
	var err error
	// The handlers' checks of their params are reported with the file's
	// other problems, at their lines, not once those are fixed.
	params := func(c *config.Config) error { return e.checkParams(c, path) }
	if path == "" {
		cfg = config.Default()
		err = errors.Join(cfg.Validate(e.reg.Has), params(cfg))
	} else {
		cfg, err = config.LoadFor(path, e.reg.Has, params)
	}
	if err != nil {
		e.configError(err)
		return nil, false
	}
	return cfg, true
}

func (e *env) configError(err error) {
	fmt.Fprintln(e.stderr, "scheduler: invalid configuration:")
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, one := range joined.Unwrap() {
			fmt.Fprintln(e.stderr, "  "+one.Error())
		}
		return
	}
	fmt.Fprintln(e.stderr, "  "+err.Error())
}

func (e *env) fail(format string, args ...any) int {
	fmt.Fprintf(e.stderr, "scheduler: "+format+"\n", args...)
	return ExitRuntime
}

func (e *env) migrate(args []string) int {
	fs, path := e.flags("migrate", "[--config FILE] [--yes] up|down|status")
	yes := fs.Bool("yes", false, "down: roll back the newest migration, and drop what it created, with its data")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 || (fs.Arg(0) != "up" && fs.Arg(0) != "down" && fs.Arg(0) != "status") {
		fmt.Fprintln(e.stderr, "scheduler migrate: want exactly one of up, down, status")
		fs.Usage()
		return ExitUsage
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	// Opening the SQLite file creates it, migrated: status would report a
	// fresh file's migrations as the fleet's, and leave a file replicas
	// started later join with fences starting over. Only up may create it.
	if fs.Arg(0) != "up" {
		if err := sqliteMissing(cfg); err != nil {
			return e.fail("migrate %s: %v", fs.Arg(0), err)
		}
	}
	ctx := context.Background()
	b, err := openBackend(ctx, cfg, false)
	if err != nil {
		return e.fail("%v", err)
	}
	defer b.Close()
	if b.DB == nil {
		return e.fail("claimer %q keeps no SQL schema; nothing to migrate", cfg.Claimer.Kind)
	}
	switch fs.Arg(0) {
	case "up":
		err = migrations.Up(ctx, b.DB, b.Dialect)
	case "down":
		var name string
		if name, err = e.mayRollBack(ctx, b, *yes); err == nil {
			if err = migrations.Down(ctx, b.DB, b.Dialect); err == nil {
				fmt.Fprintf(e.stdout, "rolled back %s\n", name)
			}
		}
		var usage errUsage
		if errors.As(err, &usage) {
			fmt.Fprintf(e.stderr, "scheduler migrate down: %v\n", err)
			return ExitUsage
		}
	}
	if err != nil {
		return e.fail("migrate %s: %v", fs.Arg(0), err)
	}
	st, err := migrations.Status(ctx, b.DB, b.Dialect)
	if err != nil {
		return e.fail("migrate status: %v", err)
	}
	for _, m := range st {
		fmt.Fprintln(e.stdout, m.String())
	}
	return ExitOK
}

// errUsage is a command refused for how it was asked (exit 2).
type errUsage struct{ error }

// mayRollBack says whether `migrate down` may roll back b's newest
// applied migration, and names it. A rollback drops what the migration
// created, with its data (00002: every invoice, which is what makes
// billing idempotent and fenced; 00003: the pauses and requests), and a
// fleet running on the schema fails closed until `migrate up`: an
// outside review ran it beside three replicas, and it said nothing of
// either. So it is refused while any replica is up (exit 1), and asked
// for with --yes, after the rollback is named (exit 2).
func (e *env) mayRollBack(ctx context.Context, b *claimers.Backend, yes bool) (string, error) {
	st, err := migrations.Status(ctx, b.DB, b.Dialect)
	if err != nil {
		return "", err
	}
	var newest *migrations.Migration
	for i := range st {
		if st[i].Applied {
			newest = &st[i]
		}
	}
	if newest == nil {
		return "", migrations.ErrNoMigration
	}
	if b.Controls != nil {
		// The register lives in a table a rollback may already have
		// dropped (00003): then no replica can announce itself either.
		if ms, err := control.New(b.Controls, nil).Members(ctx); err == nil && len(ms) > 0 {
			return "", fmt.Errorf("replicas are up (%s): stop them first; rolled back under them, the schema "+
				"makes every replica fail closed (not ready, running nothing) until `scheduler migrate up`",
				strings.Join(ms, ", "))
		}
	}
	drops, err := migrations.Drops(b.Dialect, newest.Name)
	if err != nil {
		return "", err
	}
	if yes {
		return newest.Name, nil
	}
	what := "."
	if len(drops) > 0 {
		what = ", which drops " + strings.Join(drops, ", ") + " and everything in them."
	}
	return "", errUsage{fmt.Errorf("this rolls back %s%s Run it again with --yes to do so", newest.Name, what)}
}

// jobView is one line of `scheduler jobs`.
type jobView struct {
	Name     string      `json:"name"`
	Schedule string      `json:"schedule"`
	Timezone string      `json:"timezone"`
	Enabled  bool        `json:"enabled"`
	Next     []time.Time `json:"next"`
	// Paused is the pause switch that governs the job, if one was ever
	// set; nil also when the backend could not be read (a warning says so).
	Paused *control.Pause `json:"paused"`
}

func (e *env) jobs(args []string) int {
	fs, path := e.flags("jobs", "[--config FILE] [--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := e.parseNoArgs(fs, args); !ok {
		return code
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	now := time.Now()
	pauses := e.readPauses(cfg)
	var views []jobView
	for _, name := range sortedJobs(cfg) {
		j := cfg.Jobs[name]
		s, err := schedule.Parse(j.Schedule, j.Timezone)
		if err != nil { // validated already; keep the message if not
			return e.fail("jobs.%s.schedule: %v", name, err)
		}
		v := jobView{Name: name, Schedule: j.Schedule, Timezone: s.Location().String(), Enabled: j.Enabled}
		if p, ok := pauses.Of(name); ok {
			v.Paused = &p
		}
		for at := now; len(v.Next) < 3; {
			at = s.Next(at)
			v.Next = append(v.Next, at)
		}
		views = append(views, v)
	}
	// Without the pause switches the listing is only half an answer: it
	// is printed, and the exit status says so (a script reading "PAUSED
	// ?" as a success would be misled).
	incomplete := ExitOK
	if pauses == nil {
		incomplete = ExitRuntime
	}
	if *asJSON {
		return max(e.printJSON(views), incomplete)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSCHEDULE\tTIMEZONE\tENABLED\tPAUSED\tNEXT")
	for _, v := range views {
		paused := "no"
		switch {
		case pauses == nil:
			paused = "?"
		case v.Paused != nil && v.Paused.Paused:
			paused = fmt.Sprintf("yes, by %s at %s", v.Paused.By, v.Paused.At.Format(time.RFC3339))
			if n := v.Paused.Note; n != "" {
				// A note may hold line breaks and tabs (control.CheckText):
				// quoted, it keeps the table one line a job and its columns.
				if strings.ContainsAny(n, "\n\t") {
					n = strconv.Quote(n)
				}
				paused += ": " + n
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s, %s, %s\n", v.Name, v.Schedule, v.Timezone, v.Enabled, paused,
			v.Next[0].Format(time.RFC3339), v.Next[1].Format(time.RFC3339), v.Next[2].Format(time.RFC3339))
	}
	_ = tw.Flush()
	return incomplete
}

// readPauses reads the pause switches from cfg's backend for `jobs`; nil,
// with a warning, if it cannot.
func (e *env) readPauses(cfg *config.Config) control.Pauses {
	// No SQLite file yet: nothing can be paused, and opening would create
	// the file (see openExisting).
	if err := sqliteMissing(cfg); err != nil {
		fmt.Fprintf(e.stderr, "scheduler jobs: %v; no job is paused\n", err)
		return control.Pauses{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := openBackend(ctx, cfg, false)
	if err == nil {
		defer b.Close()
		var ps control.Pauses
		if ps, err = control.New(b.Controls, nil).Pauses(ctx); err == nil {
			return ps
		}
	}
	fmt.Fprintf(e.stderr, "scheduler jobs: cannot read pause switches from claimer %s: %v\n", cfg.Claimer.Kind, err)
	return nil
}

func (e *env) printJSON(v any) int {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return e.fail("%v", err)
	}
	return ExitOK
}

func sortedJobs(cfg *config.Config) []string {
	names := make([]string, 0, len(cfg.Jobs))
	for n := range cfg.Jobs {
		names = append(names, n)
	}
	sortStrings(names)
	return names
}
