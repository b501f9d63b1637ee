package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/job"
)

// What a binary adds to Main besides plain handlers: jobs registered with a
// job.Opener, opened here on the loaded configuration, and its own
// subcommands.

// openJobs opens the jobs among names that were registered with an Opener
// (job.Registry.Open), on cfg's database block; with prom set they may
// register metrics there. The returned func releases what they opened.
func (e *env) openJobs(ctx context.Context, cfg *config.Config, prom prometheus.Registerer, names ...string) (func() error, error) {
	// Connecting and migrating a healthy database takes well under this.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	closeJobs, err := e.reg.Open(ctx, resources(cfg, prom), names...)
	return closeJobs, redactDatabase(err, cfg.Database)
}

// redactDatabase masks in err, an opener's, the passwords of d, the
// database the openers were given: an opener's error is the binary's
// own text, which may repeat the DSN it was handed (an outside review
// found one logged with its password).
func redactDatabase(err error, d config.Database) error {
	if err == nil {
		return nil
	}
	err = config.RedactError(err, d.DSN)
	if pw := string(d.Password); pw != "" && strings.Contains(err.Error(), pw) {
		err = errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
	}
	return err
}

// resources is what openers and commands get from cfg.
func resources(cfg *config.Config, prom prometheus.Registerer) job.Resources {
	d := cfg.Database
	return job.Resources{Metrics: prom,
		Database: job.Database{Kind: d.Kind, Path: d.Path, DSN: d.DSN, Password: string(d.Password)}}
}

// enabledJobs lists the names of cfg's enabled jobs.
func enabledJobs(cfg *config.Config) []string {
	var out []string
	for _, name := range sortedJobs(cfg) {
		if cfg.Jobs[name].Enabled {
			out = append(out, name)
		}
	}
	return out
}

// Command is a subcommand a binary adds to Main's own, as cmd/scheduler
// adds seed (demo data for its billing.nightly). Main gives it --config,
// loads and validates the configuration as for its own commands, and runs
// it under a context that SIGINT and SIGTERM cancel.
type Command struct {
	// Name is the subcommand: scheduler Name. It must not be one of Main's.
	Name string
	// Synopsis shows its flags and arguments, [--config FILE] included.
	Synopsis string
	// Summary is its line in the usage text.
	Summary string
	// Example, optional, ends its --help: one example per line.
	Example string
	// Setup declares the command's flags on fs, which has --config, and
	// returns the Action that runs the command.
	Setup func(fs *flag.FlagSet) Action
}

// Action runs a Command once its flags are parsed and the configuration is
// loaded. An error made by Usagef exits 2, any other error 1; Main prints
// it.
type Action func(ctx context.Context, in Invocation) error

// Invocation is what an Action runs on.
type Invocation struct {
	Args      []string      // the arguments after the flags
	Resources job.Resources // from the configuration; Metrics is nil
	Stdout    io.Writer
}

// Usagef returns an Action's error for bad flags or arguments.
func Usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

type usageError struct{ error }

// checkCommands rejects commands that Main could not tell apart. Main's own
// commands are the ones its usage text lists.
func checkCommands(cmds []Command) error {
	seen := map[string]bool{}
	for _, c := range cmds {
		switch {
		case c.Name == "" || strings.HasPrefix(c.Name, "-") || strings.ContainsAny(c.Name, " \t\n"):
			return fmt.Errorf("command %q: not a command name", c.Name)
		case c.Name == "help" || strings.Contains(usage, "\n  scheduler "+c.Name+" ") ||
			strings.Contains(usage, "\n  scheduler "+c.Name+"\n"):
			return fmt.Errorf("command %q: built in", c.Name)
		case seen[c.Name]:
			return fmt.Errorf("command %q: added twice", c.Name)
		case c.Setup == nil:
			return fmt.Errorf("command %q: no Setup", c.Name)
		}
		if err := trySetup(c); err != nil {
			return err
		}
		seen[c.Name] = true
	}
	return nil
}

// trySetup calls c's Setup on a flag set like the one it runs with, so
// that a Setup that declares --config again or returns no Action is
// refused when the binary starts, not found by a panic when the command
// is run, or when completion lists its flags (an outside review).
func trySetup(c Command) (err error) {
	fs := flag.NewFlagSet(c.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("config", "", "")
	defer func() {
		if x := recover(); x != nil {
			err = fmt.Errorf("command %q: Setup panicked: %v (fs already has --config)", c.Name, x)
		}
	}()
	if c.Setup(fs) == nil {
		return fmt.Errorf("command %q: Setup returned no Action", c.Name)
	}
	return nil
}

// usageWith is the usage text with cmds listed before version.
func usageWith(cmds []Command) string {
	var b strings.Builder
	for _, c := range cmds {
		fmt.Fprintf(&b, "  scheduler %-8s %s  %s\n", c.Name, c.Synopsis, c.Summary)
	}
	return strings.Replace(usage, "  scheduler version\n", b.String()+"  scheduler version\n", 1)
}

// command runs c with args.
func (e *env) command(c Command, args []string) int {
	fs, path := e.flags(c.Name, c.Synopsis)
	action := c.Setup(fs)
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	ctx, stop := e.stoppable(c.Name)
	defer stop()
	err := action(ctx, Invocation{Args: fs.Args(), Resources: resources(cfg, nil), Stdout: e.stdout})
	var ue usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "scheduler %s: %v\n", c.Name, err)
		return ExitUsage
	}
	return e.fail("%v", err)
}
