package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/internal/control"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/internal/web"
)

// runs lists recorded runs, newest first, as web.Runs describes them (the
// status page and GET /api/runs show the same): with the failed attempts
// of jobs that retry, the retry pending, and the start under jitter.
func (e *env) runs(args []string) int {
	fs, path := e.flags("runs", "[--config FILE] [--job J] [--limit N] [--attempts] [--json]")
	jobName := fs.String("job", "", "only runs of `JOB`")
	limit := fs.Int("limit", 20, "at most `N` runs, newest first")
	attempts := fs.Bool("attempts", false, "list each run's recorded earlier attempts (failed, timed out, interrupted) under it (--json always has them)")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := e.parseNoArgs(fs, args); !ok {
		return code
	}
	if *limit < 1 {
		fmt.Fprintf(e.stderr, "scheduler runs: --limit %d: must be at least 1\n", *limit)
		return ExitUsage
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	info, err := jobInfos(cfg)
	if err != nil {
		return e.fail("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := openExisting(ctx, cfg)
	if err != nil {
		return e.fail("%v", err)
	}
	defer b.Close()
	recs, err := b.History(ctx, *jobName, *limit)
	if err != nil {
		return e.fail("runs: %v", err)
	}
	if _, known := cfg.Jobs[*jobName]; *jobName != "" && !known && len(recs) == 0 {
		// A removed job's history is still shown; a name with neither a
		// job nor a run is a typo, said as pause and trigger say it (an
		// empty table, exit 0, read as "it never ran": an outside review).
		fmt.Fprintf(e.stderr, "scheduler runs: --job %q: no such job in the configuration, and no run of it recorded\n", *jobName)
		return ExitUsage
	}
	prefix := ""
	if *jobName != "" {
		prefix = *jobName + "@"
	}
	atts, err := control.New(b.Controls, nil).Attempts(ctx, prefix)
	if err != nil {
		return e.fail("runs: failed attempts: %v", err)
	}
	runs := web.Runs(recs, atts, info)
	if *asJSON {
		return e.printJSON(runs)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tINSTANT\tSTATUS\tHOLDER\tATTEMPT\tFENCE\tSTARTED\tFINISHED\tDURATION\tNOTE")
	for _, r := range runs {
		fin, dur := "-", "-"
		if !r.FinishedAt.IsZero() {
			fin = r.FinishedAt.UTC().Format(time.RFC3339)
			dur = r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
		}
		// The instant to the nanosecond where it has any: a manual run's
		// (its request time) must not read as its second's scheduled run.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.Job, r.At.UTC().Format(time.RFC3339Nano), r.Status,
			r.Holder, ofMax(r.Attempt, r.MaxAttempts), r.Fence, r.StartedAt.UTC().Format(time.RFC3339), fin, dur, runNote(r, *attempts))
		if !*attempts {
			continue
		}
		for _, a := range r.Attempts {
			note := "error: " + oneLine(a.Error, 120)
			if !a.RetryAt.IsZero() {
				note = "retry due " + a.RetryAt.UTC().Format(time.RFC3339) + "; " + note
			}
			fmt.Fprintf(tw, "  ↳\t\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", a.Status, a.Holder, a.Attempt, a.Fence,
				a.Started.UTC().Format(time.RFC3339), a.Ended.UTC().Format(time.RFC3339),
				a.Ended.Sub(a.Started).Round(time.Millisecond), note)
		}
	}
	_ = tw.Flush()
	return ExitOK
}

// jobInfos describes every configured job, disabled ones too (their past
// runs are still listed), for web.Runs.
func jobInfos(cfg *config.Config) ([]web.JobInfo, error) {
	var info []web.JobInfo
	for _, name := range sortedJobs(cfg) {
		j := cfg.Jobs[name]
		s, err := schedule.Parse(j.Schedule, j.Timezone)
		if err != nil { // validated already; keep the message if not
			return nil, fmt.Errorf("jobs.%s.schedule: %w", name, err)
		}
		info = append(info, web.JobInfo{Name: name, Schedule: j.Schedule, Timezone: s.Location().String(), Next: s.Next,
			Parsed: s, Jitter: j.Jitter.Duration(), MaxAttempts: j.MaxAttempts})
	}
	return info, nil
}

// ofMax is "n/total", or "n" when total is unknown (0).
func ofMax(n, total int) string {
	if total == 0 {
		return strconv.Itoa(n)
	}
	return fmt.Sprintf("%d/%d", n, total)
}

// runNote is the NOTE of r's line in `scheduler runs`: the retry pending,
// the jitter it started under, and its failed attempts unless listed.
func runNote(r web.Run, listed bool) string {
	var parts []string
	if p := r.RetryPending; p != nil {
		parts = append(parts, "retry "+ofMax(p.Attempt, r.MaxAttempts)+" at "+p.At.UTC().Format(time.RFC3339))
	}
	if r.StartsAt != nil {
		off := r.StartsAt.Sub(r.At)
		if off >= time.Second {
			off = off.Round(time.Second)
		}
		parts = append(parts, "starts +"+off.String()+" (jitter)")
	}
	if n := len(r.Attempts); n > 0 && !listed {
		parts = append(parts, attemptsNote(r.Attempts))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

// attemptsNote counts a run's recorded earlier attempts by how they
// ended: "2 failed attempts", or, mixed, "3 earlier attempts: 1 failed,
// 2 interrupted". Attempts handed back at a shutdown are recorded
// interrupted and do not count against max_attempts; calling them failed
// misled (an outside review).
func attemptsNote(atts []control.Attempt) string {
	var order []claim.Status
	count := map[claim.Status]int{}
	for _, a := range atts {
		if count[a.Status] == 0 {
			order = append(order, a.Status)
		}
		count[a.Status]++
	}
	n := len(atts)
	if len(order) == 1 {
		return fmt.Sprintf("%d %s attempt%s (--attempts)", n, order[0], plural(n))
	}
	var each []string
	for _, st := range order {
		each = append(each, fmt.Sprintf("%d %s", count[st], st))
	}
	return fmt.Sprintf("%d earlier attempts: %s (--attempts)", n, strings.Join(each, ", "))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// oneLine is s on one line, at most limit runes: a handler's error may
// span lines or carry tabs, which would break the table.
func oneLine(s string, limit int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > limit {
		s = string(r[:limit]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}
