package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/runner"
)

// The operator's controls: pause, resume, trigger (through the fleet) and
// backfill. Each writes to, or claims through, the configured claimer's
// backend, which every replica reads: none talks to a replica.

// controlTimeout bounds a control's round trips to the backend.
const controlTimeout = 30 * time.Second

// openControls opens cfg's backend for a control command.
func (e *env) openControls(ctx context.Context, cfg *config.Config) (*claimers.Backend, *control.Store, bool) {
	b, err := openExisting(ctx, cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "scheduler: cannot open claimer %s: %v\n", cfg.Claimer.Kind, err)
		return nil, nil, false
	}
	return b, control.New(b.Controls, nil), true
}

// jobArg checks the one JOB argument against cfg; all is the command's
// --all flag, nil if it has none.
func (e *env) jobArg(cmd string, cfg *config.Config, args []string, all *bool) (string, bool) {
	switch {
	case all != nil && *all && len(args) == 0:
		return control.AllJobs, true
	case all != nil && *all:
		fmt.Fprintf(e.stderr, "scheduler %s: give a JOB or --all, not both\n", cmd)
		return "", false
	case len(args) != 1 && all != nil:
		fmt.Fprintf(e.stderr, "scheduler %s: want exactly one JOB (or --all)\n", cmd)
		return "", false
	case len(args) != 1:
		fmt.Fprintf(e.stderr, "scheduler %s: want exactly one JOB\n", cmd)
		return "", false
	}
	if _, ok := cfg.Jobs[args[0]]; !ok {
		fmt.Fprintf(e.stderr, "scheduler %s: no job %q in the configuration (have %v)\n", cmd, args[0], sortedJobs(cfg))
		return "", false
	}
	return args[0], true
}

func (e *env) pause(args []string) int { return e.setPause("pause", args, true) }

func (e *env) resume(args []string) int { return e.setPause("resume", args, false) }

func (e *env) setPause(cmd string, args []string, paused bool) int {
	fs, path := e.flags(cmd, "[--config FILE] [--note TEXT] [--by WHO] JOB|--all")
	all := fs.Bool("all", false, "every job, including jobs added later")
	note := fs.String("note", "", "why, shown by scheduler jobs, the status page and the logs")
	by := fs.String("by", control.Identity(), "who, recorded with the switch")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if err := control.CheckTexts(*note, *by, ""); err != nil {
		fmt.Fprintf(e.stderr, "scheduler %s: --%v\n", cmd, err)
		return ExitUsage
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	job, ok := e.jobArg(cmd, cfg, fs.Args(), all)
	if !ok {
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	b, ctl, ok := e.openControls(ctx, cfg)
	if !ok {
		return ExitRuntime
	}
	defer b.Close()
	p, err := ctl.SetPause(ctx, control.Pause{Job: job, Paused: paused, Note: *note, By: *by})
	if err != nil {
		return e.fail("%s %s: %v", cmd, job, err)
	}
	if p.Paused != paused {
		return e.fail("%s %s: a later switch by %s at %s won: paused=%t", cmd, job, p.By, p.At.Format(time.RFC3339), p.Paused)
	}
	what := job
	if job == control.AllJobs {
		what = "every job"
	}
	fmt.Fprintf(e.stdout, "%s %sd by %s at %s; every replica honours it within a second\n", what, cmd, p.By, p.At.Format(time.RFC3339))
	return ExitOK
}

func (e *env) trigger(args []string) int {
	fs, path := e.flags("trigger", "[--config FILE] [--note TEXT] [--by WHO] [--request-id ID] [--overlap allow] [--wait [--timeout D]] [--here] JOB")
	note := fs.String("note", "", "why, recorded with the request")
	by := fs.String("by", control.Identity(), "who, recorded with the request")
	reqID := fs.String("request-id", "", "idempotency `KEY`: a request sent again with it runs nothing more (default: random)")
	overlap := fs.String("overlap", "", "`allow` runs it even while an earlier run of the job is live (default: the job's policy)")
	wait := fs.Bool("wait", false, "follow the run to its end and exit with its status")
	timeout := fs.Duration("timeout", time.Hour, "with --wait, give up after `DURATION`")
	here := fs.Bool("here", false, "claim and execute the run in this process instead of asking the fleet")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	if *overlap != "" && *overlap != runner.OverlapAllow {
		fmt.Fprintf(e.stderr, "scheduler trigger: --overlap %q: want allow\n", *overlap)
		return ExitUsage
	}
	if err := control.CheckTexts(*note, *by, *reqID); err != nil {
		fmt.Fprintf(e.stderr, "scheduler trigger: --%s\n", strings.Replace(err.Error(), "request_id", "request-id", 1))
		return ExitUsage
	}
	// --timeout bounds --wait's following of a request; said without it
	// (or with --here, which runs the job to its end), it would be
	// dropped without a word.
	timed := false
	fs.Visit(func(f *flag.Flag) { timed = timed || f.Name == "timeout" })
	if timed && (!*wait || *here) {
		fmt.Fprintf(e.stderr, "scheduler trigger: --timeout %s: only with --wait, and not with --here\n", *timeout)
		return ExitUsage
	}
	// Checked before the request is sent: a wait that could never
	// succeed must not leave a run queued behind it (outside review).
	if *timeout <= 0 {
		fmt.Fprintf(e.stderr, "scheduler trigger: --timeout %s: want a positive duration\n", *timeout)
		return ExitUsage
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	name, ok := e.jobArg("trigger", cfg, fs.Args(), nil)
	if !ok {
		return ExitUsage
	}
	if !cfg.Jobs[name].Enabled {
		fmt.Fprintf(e.stderr, "scheduler trigger: job %q is disabled in the configuration\n", name)
		return ExitUsage
	}
	if *here {
		// --here runs the job in this process, without a request in the
		// backend: there is nothing for an idempotency key to find.
		if *reqID != "" {
			fmt.Fprintf(e.stderr, "scheduler trigger: --request-id %q: a request's key; --here runs the job without a request\n", *reqID)
			return ExitUsage
		}
		return e.triggerHere(cfg, *path, name, runner.TriggerOptions{Overlap: *overlap, By: *by, Note: *note})
	}
	// This process holds no run: the fleet runs the request, which
	// outlives a stop.
	ctx, stop := e.stoppableLeaving("trigger", "the request stays queued; the fleet runs it")
	defer stop()
	octx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	b, ctl, ok := e.openControls(octx, cfg)
	if !ok {
		return ExitRuntime
	}
	defer b.Close()
	req, created, err := ctl.Request(octx, control.Request{ID: *reqID, Job: name, Note: *note, By: *by, Overlap: *overlap})
	if err != nil {
		return e.fail("trigger %s: %v", name, err)
	}
	window := runner.RequestWindow(cfg.Jobs[name].Misfire.Grace.Duration(), cfg.Claimer.MaxClockSkew.Duration())
	switch {
	case created && noReplicaUp(octx, ctl):
		// Said now, not found out at the window's end (an outside
		// review: "the fleet runs it within a second", with none up).
		fmt.Fprintf(e.stdout, "requested %s (request %s); no replica is up now: it runs if one starts within %s "+
			"(the larger of misfire.grace and the late tolerance)\n", req.Run().ID(), req.ID, window.Round(time.Second))
	case created:
		fmt.Fprintf(e.stdout, "requested %s (request %s); the fleet runs it within a second\n", req.Run().ID(), req.ID)
	case req.Job != name:
		// The key is taken: the request it names runs another job, and
		// this one would never run. (The API answers 409.)
		return e.fail("trigger %s: request %s was already made for job %s (%s, by %s at %s); choose another --request-id",
			name, req.ID, req.Job, req.Run().ID(), req.By, req.Created.Format(time.RFC3339))
	default:
		fmt.Fprintf(e.stdout, "request %s already made by %s at %s: %s\n", req.ID, req.By, req.Created.Format(time.RFC3339), req.Run().ID())
	}
	if !*wait {
		return ExitOK
	}
	wctx, cancelWait := context.WithTimeout(ctx, *timeout)
	defer cancelWait()
	st, err := waitRun(wctx, b, req.Run())
	if err != nil && wctx.Err() != nil && ctx.Err() == nil && time.Since(req.Created) > window && !recorded(ctx, b, req.Run()) {
		// Nobody picked it up in its window: no replica will now.
		return e.fail("trigger %s: %s did not start within %s of request %s (the larger of misfire.grace and the late tolerance), "+
			"and no replica will run it now: is a replica running that runs job %s?", name, req.Run().ID(), window.Round(time.Second), req.ID, name)
	}
	// The request outlives the wait, run out or stopped: say so, and how
	// to wait again (with this config: pasted elsewhere, the command
	// would ask another backend), or an operator who triggers again
	// without its key gets a second run.
	again := "scheduler trigger"
	if *path != "" {
		again += " --config " + shellQuote(*path)
	}
	again += fmt.Sprintf(" --request-id %s --wait %s", shellQuote(req.ID), shellQuote(name))
	switch {
	case err != nil && wctx.Err() != nil && ctx.Err() == nil:
		return e.fail("trigger %s: %s did not finish within --timeout %s; request %s stays queued and the fleet will still run it. "+
			"To wait again without a second run: %s", name, req.Run().ID(), *timeout, req.ID, again)
	case err != nil && ctx.Err() != nil:
		return e.fail("trigger %s: stopped waiting for %s; request %s stays queued and the fleet will still run it. "+
			"To wait again without a second run: %s", name, req.Run().ID(), req.ID, again)
	}
	if err != nil {
		return e.fail("trigger %s: waiting for %s: %v", name, req.Run().ID(), err)
	}
	fmt.Fprintf(e.stdout, "%s: %s\n", req.Run().ID(), st)
	if st != claim.Succeeded {
		return ExitRuntime
	}
	return ExitOK
}

// recorded reports whether the backend holds a record of run (or could
// not be asked: then the fleet may still have it).
func recorded(ctx context.Context, c claim.Claimer, run claim.Run) bool {
	hctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	recs, err := c.History(hctx, run.Job, 200)
	return err != nil || slices.ContainsFunc(recs, func(r claim.Record) bool { return r.RunID == run.ID() })
}

// waitRun polls the backend until run is recorded in a terminal status.
func waitRun(ctx context.Context, c claim.Claimer, run claim.Run) (claim.Status, error) {
	id := run.ID()
	for every := 100 * time.Millisecond; ; every = min(2*every, 2*time.Second) {
		// Newest first: a manual run is among the job's latest records.
		recs, err := c.History(ctx, run.Job, 200)
		if err == nil {
			for _, r := range recs {
				if r.RunID == id && r.Status.Terminal() {
					return r.Status, nil
				}
			}
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", context.Cause(ctx)
		case <-t.C:
		}
	}
}

// triggerHere claims and executes one run of name in this process; file is
// cfg's.
func (e *env) triggerHere(cfg *config.Config, file, name string, o runner.TriggerOptions) int {
	jobsList, _, err := e.runnerJobs(cfg, file)
	if err != nil {
		e.configError(err)
		return ExitUsage
	}
	ctx, stop := e.stoppable("trigger")
	defer stop()
	r, closeAll, code := e.localRunner(ctx, cfg, jobsList, name, true)
	if code != ExitOK {
		return code
	}
	defer closeAll()
	status, err := r.Trigger(ctx, name, o)
	switch {
	case status == claim.Interrupted && ctx.Err() != nil:
		// Stopped mid-run: the run was handed back, not failed.
		fmt.Fprintf(e.stdout, "%s: %s\n", name, status)
		return e.fail("trigger %s: stopped mid-run: the run was handed back interrupted; a replica of the fleet takes it over", name)
	case status == claim.LeaseLost && ctx.Err() != nil:
		// Stopped mid-run while the backend was out of reach: the hand-back
		// was not confirmed, so the run waits out its lease.
		fmt.Fprintf(e.stdout, "%s: %s\n", name, status)
		return e.fail("trigger %s: stopped mid-run: the hand-back was not confirmed (the backend did not answer); a replica of the fleet takes the run over once its lease lapses", name)
	}
	var loss *claim.DataLossError
	if errors.As(err, &loss) {
		// Not another replica's: the backend holds every run for a lease.
		return e.fail("trigger %s: %s lost its data or just restarted, and holds every run until %s, by when every holder from before has stood down; nothing ran: trigger again then",
			name, loss.Backend, loss.Until.UTC().Format(time.RFC3339))
	}
	if status == "" && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped while the claim waited on the backend (an outage): the
		// run is named in the register before its bid, so a grant that
		// lands after this process has gone is taken over by the fleet.
		return e.fail("trigger %s: stopped before the run was granted: nothing ran here; should the backend still grant it, a replica of the fleet takes it over", name)
	}
	if err != nil {
		return e.fail("%v", err)
	}
	fmt.Fprintf(e.stdout, "%s: %s\n", name, status)
	if status != claim.Succeeded {
		return ExitRuntime
	}
	return ExitOK
}

// localRunner opens cfg's backend and, with openJob, the resources of job
// name, and returns a runner over them for work done in this process
// (trigger --here, backfill) and what closes it all; a nonzero code if it
// could not.
func (e *env) localRunner(ctx context.Context, cfg *config.Config, jobsList []runner.Job, name string, openJob bool) (*runner.Runner, func(), int) {
	log := newLogger(cfg, e.stderr)
	b, err := openForCommand(ctx, cfg)
	if err != nil {
		log.Error("cannot open claimer backend", "claimer", cfg.Claimer.Kind, "error", err.Error())
		return nil, nil, ExitRuntime
	}
	closeJobs := func() error { return nil }
	if openJob {
		if closeJobs, err = e.openJobs(ctx, cfg, nil, name); err != nil {
			log.Error("cannot open a job", "database", cfg.Database.Kind, "error", err.Error())
			b.Close()
			return nil, nil, ExitRuntime
		}
	}
	closeAll := func() { _ = closeJobs(); b.Close() }
	r, err := runner.New(runnerOptions(cfg, b, log, nil), jobsList)
	if err != nil {
		closeAll()
		return nil, nil, e.fail("%v", err)
	}
	return r, closeAll, ExitOK
}

func (e *env) backfill(args []string) int {
	fs, path := e.flags("backfill", "[--config FILE] --from TIME --to TIME [--rerun none|failed|skipped|all] [--max-concurrent N] [--newest-first] [--dry-run] [--json] JOB")
	from := fs.String("from", "", "first instant, RFC 3339 (2026-11-01T00:00:00Z) or a date (2026-11-01, UTC)")
	to := fs.String("to", "", "last instant, same forms; not in the future")
	rerun := fs.String("rerun", runner.RerunNone, "which recorded instants to run again: `none`, failed, skipped (paused or for overlap: they never ran) or all (missed ones always run)")
	maxConc := fs.Int("max-concurrent", 1, "instants run at once")
	newest := fs.Bool("newest-first", false, "run the newest instants first")
	dry := fs.Bool("dry-run", false, "print the plan; claim and run nothing")
	asJSON := fs.Bool("json", false, "print the items and the summary as JSON")
	if code, ok := e.parse(fs, args); !ok {
		return code
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	name, ok := e.jobArg("backfill", cfg, fs.Args(), nil)
	if !ok {
		return ExitUsage
	}
	var o runner.BackfillOptions
	var err error
	if o.From, err = parseInstant(*from); err != nil {
		fmt.Fprintf(e.stderr, "scheduler backfill: --from %q: %v\n", *from, err)
		return ExitUsage
	}
	if o.To, err = parseInstant(*to); err != nil {
		fmt.Fprintf(e.stderr, "scheduler backfill: --to %q: %v\n", *to, err)
		return ExitUsage
	}
	switch now := time.Now(); {
	case o.To.Before(o.From):
		fmt.Fprintf(e.stderr, "scheduler backfill: --to %s is before --from %s\n", *to, *from)
		return ExitUsage
	case o.To.After(now):
		fmt.Fprintf(e.stderr, "scheduler backfill: --to %s is in the future (now %s); the replicas run what falls due\n",
			*to, now.UTC().Format(time.RFC3339))
		return ExitUsage
	}
	if !slices.Contains(runner.RerunPolicies, *rerun) {
		fmt.Fprintf(e.stderr, "scheduler backfill: --rerun %q: want %s\n", *rerun, strings.Join(runner.RerunPolicies, ", "))
		return ExitUsage
	}
	if *maxConc < 1 {
		fmt.Fprintf(e.stderr, "scheduler backfill: --max-concurrent %d: must be at least 1\n", *maxConc)
		return ExitUsage
	}
	if ttl, key := forgets(cfg); runner.Forgotten(ttl, key, o.From, time.Now()) != nil {
		err := runner.Forgotten(ttl, key, o.From, time.Now())
		fmt.Fprintf(e.stderr, "scheduler backfill: --from %s: %v\n", *from, err)
		return ExitUsage
	}
	o.Rerun, o.MaxConcurrent, o.NewestFirst, o.DryRun = *rerun, *maxConc, *newest, *dry

	jobsList, _, err := e.runnerJobs(cfg, *path)
	if err != nil {
		e.configError(err)
		return ExitUsage
	}
	if !slices.ContainsFunc(jobsList, func(j runner.Job) bool { return j.Name == name }) {
		fmt.Fprintf(e.stderr, "scheduler backfill: job %q is disabled in the configuration\n", name)
		return ExitUsage
	}
	ctx, stop := e.stoppable("backfill")
	defer stop()
	r, closeAll, code := e.localRunner(ctx, cfg, jobsList, name, !o.DryRun)
	if code != ExitOK {
		return code
	}
	defer closeAll()
	tty := isTerminal(e.stdout)
	if tty && !*asJSON {
		o.Progress = func(it runner.BackfillItem, s runner.BackfillSummary) {
			if o.DryRun {
				return
			}
			fmt.Fprintf(e.stdout, "\r%s: %d/%d settled · %d succeeded · %d failed · %d elsewhere · %d errors ",
				name, s.Settled, s.Planned, s.Succeeded, s.Failed, s.Elsewhere, s.Errors)
		}
	}
	items, sum, err := r.Backfill(ctx, name, o)
	if tty && !*asJSON && !o.DryRun {
		fmt.Fprintln(e.stdout)
	}
	if err != nil && sum.Instants == 0 {
		return e.fail("%v", err)
	}
	if *asJSON {
		if code := e.printJSON(struct {
			Items   []runner.BackfillItem  `json:"items"`
			Summary runner.BackfillSummary `json:"summary"`
		}{items, sum}); code != ExitOK {
			return code
		}
	} else {
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "INSTANT\tACTION\tWAS\tRUN\tSTATUS")
		for _, it := range items {
			if it.Action == runner.ActionKeep && !o.DryRun {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", it.At.Format(time.RFC3339), it.Action, dash(it.Was), it.RunID, dash(it.Status))
		}
		_ = tw.Flush()
		fmt.Fprint(e.stdout, backfillSummary(name, o, sum))
	}
	switch {
	case err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) && sum.Planned == 0 && sum.Settled == 0:
		// Stopped before its plan was made (the history read waited on
		// the backend): nothing was claimed.
		return e.fail("backfill %s: stopped before it claimed anything: nothing ran; run it again to backfill the range", name)
	case err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled):
		// Stopped mid-way: the summary above says what ran and what the
		// rest need; a bare "context canceled" after it said nothing
		// more (an outside review).
		return e.fail("backfill %s: stopped", name)
	case err != nil:
		return e.fail("backfill %s: %v", name, err)
	case sum.Failed > 0 || sum.Interrupted > 0 || sum.Errors > 0:
		return ExitRuntime
	}
	return ExitOK
}

// backfillSummary is the text backfill ends with. A backfill stopped
// early (SIGTERM, Ctrl-C) says how many of its planned runs it reached
// and what the rest need, rather than that it ran them all.
func backfillSummary(name string, o runner.BackfillOptions, sum runner.BackfillSummary) string {
	var b strings.Builder
	ran := fmt.Sprintf("ran %d", sum.Settled)
	switch {
	case o.DryRun:
		ran = fmt.Sprintf("would run %d", sum.Planned)
	case sum.Settled < sum.Planned:
		ran = fmt.Sprintf("ran %d of %d planned", sum.Settled, sum.Planned)
	}
	fmt.Fprintf(&b, "%s: %d instants from %s to %s; %s, kept %d already recorded; %d succeeded, %d failed, %d done or held elsewhere, %d errors\n",
		name, sum.Instants, o.From.Format(time.RFC3339), o.To.Format(time.RFC3339), ran, sum.Kept,
		sum.Succeeded, sum.Failed, sum.Elsewhere, sum.Errors)
	if sum.Interrupted > 0 {
		fmt.Fprintf(&b, "%d interrupted mid-run (handed back, or its lease lost): a replica takes them over, or run the same backfill again to resume them\n", sum.Interrupted)
	}
	if n := sum.Planned - sum.Settled; n > 0 && !o.DryRun {
		fmt.Fprintf(&b, "%d not started: the backfill stopped first; run the same backfill again to run them\n", n)
	}
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// parseInstant reads RFC 3339 or a date (midnight UTC).
func parseInstant(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, errors.New("required")
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, errors.New("want RFC 3339 (2026-11-01T02:00:00Z) or a date (2026-11-01)")
	}
	return t, nil
}

// forgets is how long cfg's claimer remembers a finished run, and the
// setting that says so: Redis, Redlock and etcd forget a run done_ttl
// after it ended; the SQL backends keep runs until `scheduler prune`,
// whose shortest age is pruneFloor (0: the runner needs no check).
func forgets(cfg *config.Config) (time.Duration, string) {
	switch cfg.Claimer.Kind {
	case config.ClaimerRedis:
		return cfg.Claimer.Redis.DoneTTL.Duration(), "claimer.redis.done_ttl"
	case config.ClaimerRedlock:
		return cfg.Claimer.Redlock.DoneTTL.Duration(), "claimer.redlock.done_ttl"
	case config.ClaimerEtcd:
		return cfg.Claimer.Etcd.DoneTTL.Duration(), "claimer.etcd.done_ttl"
	}
	return 0, ""
}

// noReplicaUp reports whether the fleet's membership, read from the
// backend, lists no replica; false if it cannot be read.
func noReplicaUp(ctx context.Context, ctl *control.Store) bool {
	ms, err := ctl.Members(ctx)
	return err == nil && len(ms) == 0
}

// shellQuote quotes s for a POSIX shell if it needs it, so that a
// command the CLI suggests can be pasted as it is.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
