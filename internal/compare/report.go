package compare

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Schema names the JSON report's format; it changes only when a field
// changes meaning or disappears (docs/compare.md).
const Schema = "scheduler.compare/v1"

// Cell statuses.
const (
	StatusOK      = "ok"      // no duplicate, no missed run, no stale write accepted, no history violation
	StatusFailed  = "failed"  // at least one of those
	StatusSkipped = "skipped" // the scenario does not apply or the backend is not configured
	StatusError   = "error"   // the cell could not run (backend unreachable, …)
)

// Report is the outcome of one compare run. Its JSON form is documented in
// docs/compare.md.
type Report struct {
	Schema     string    `json:"schema"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Seed       uint64    `json:"seed"`
	Settings   Settings  `json:"settings"`
	// OK is false when a cell failed or could not run; the CLI then exits 1.
	OK       bool     `json:"ok"`
	Failures []string `json:"failures"`
	Cells    []*Cell  `json:"cells"`
}

// Settings echo what was run.
type Settings struct {
	Claimers       []string       `json:"claimers"`
	Faults         []string       `json:"faults"`
	Replicas       int            `json:"replicas"`
	Jobs           int            `json:"jobs"`
	Workload       map[string]int `json:"workload"`
	DurationMS     float64        `json:"duration_ms"`
	LeaseMS        float64        `json:"lease_ms"`
	RenewEveryMS   float64        `json:"renew_every_ms"`
	MaxClockSkewMS float64        `json:"max_clock_skew_ms"`
}

// Dist summarises a distribution in milliseconds (nearest-rank percentiles).
type Dist struct {
	Count int     `json:"count"`
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
}

// Cell is one claimer under one fault scenario.
type Cell struct {
	Claimer string `json:"claimer"`
	Fault   string `json:"fault"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`

	DurationMS     float64    `json:"duration_ms"`
	SteadyWindowMS [2]float64 `json:"steady_window_ms"`

	RunsExpected        int `json:"runs_expected"`
	RunsExecuted        int `json:"runs_executed"`
	MissedRuns          int `json:"missed_runs"`
	Executions          int `json:"executions"`
	DuplicateExecutions int `json:"duplicate_executions"`
	Takeovers           int `json:"takeovers"`
	LeaseLost           int `json:"lease_lost"`

	FencedWrites        int `json:"fenced_writes"`
	StaleWritesRejected int `json:"stale_writes_rejected"`
	StaleWritesAccepted int `json:"stale_writes_accepted"`
	LeaseLostSeen       int `json:"lease_lost_seen"`
	// DataLossTold counts the replicas the claimer told that its backend
	// lost its data (claim.DataLossError: a Redis restarted empty).
	DataLossTold int `json:"data_loss_told,omitempty"`

	ClaimLatency     Dist    `json:"claim_latency"`
	TakeoverTime     Dist    `json:"takeover_time"`
	ScheduleLag      Dist    `json:"schedule_lag"`
	HarnessLag       Dist    `json:"harness_lag"`
	EarlyStarts      int     `json:"early_starts"`
	ClaimerCalls     int     `json:"claimer_calls"`
	RunsClaimed      int     `json:"runs_claimed"`
	RoundTripsPerRun float64 `json:"round_trips_per_run"`

	ClockOffsetsMS         map[string]float64 `json:"clock_offsets_ms,omitempty"`
	FaultEvents            []FaultEvent       `json:"fault_events"`
	DuplicateRuns          []string           `json:"duplicate_runs"`
	DuplicateDetails       []string           `json:"duplicate_details"`
	MissedRunIDs           []string           `json:"missed_run_ids"`
	StaleAcceptedResources []string           `json:"stale_accepted_resources"`
	// Violations are the history checker's findings (internal/history,
	// every cell: scripted cells feed it the same record they analyse),
	// each with its trace. A cell with one has failed.
	Violations []string `json:"violations,omitempty"`
	Notes      []string `json:"notes"`

	spans    []span          // HTML timeline
	claimLat []time.Duration // HTML latency chart
}

func (c *Cell) failed() bool {
	return c.DuplicateExecutions > 0 || c.MissedRuns > 0 || c.StaleWritesAccepted > 0 || len(c.Violations) > 0
}

// normalize makes empty lists [] rather than null in JSON.
func (c *Cell) normalize() {
	for _, p := range []*[]string{&c.DuplicateRuns, &c.DuplicateDetails, &c.MissedRunIDs, &c.StaleAcceptedResources, &c.Notes} {
		if *p == nil {
			*p = []string{}
		}
	}
	if c.FaultEvents == nil {
		c.FaultEvents = []FaultEvent{}
	}
}

// summarize fills OK and Failures from the cells.
func (r *Report) summarize() {
	r.OK, r.Failures = true, []string{}
	for _, c := range r.Cells {
		c.normalize()
		name := c.Claimer + " × " + c.Fault
		var what []string
		switch c.Status {
		case StatusError:
			what = append(what, "could not run: "+c.Reason)
		case StatusFailed:
			if n := c.StaleWritesAccepted; n > 0 {
				what = append(what, strings.ToUpper(plural(n, "stale write"))+" ACCEPTED (fencing failed)")
			}
			if n := c.DuplicateExecutions; n > 0 {
				what = append(what, plural(n, "duplicate execution"))
			}
			if n := c.MissedRuns; n > 0 {
				what = append(what, plural(n, "missed run"))
			}
			if n := len(c.Violations); n > 0 {
				what = append(what, plural(n, "violation")+" of the history checker")
			}
		}
		if len(what) > 0 {
			r.OK = false
			r.Failures = append(r.Failures, name+": "+strings.Join(what, ", "))
		}
	}
	// A gate that ran nothing must not pass: a CI job whose DSN variable
	// came out empty skips every cell.
	if len(r.Cells) > 0 && !slices.ContainsFunc(r.Cells, func(c *Cell) bool { return c.Status != StatusSkipped }) {
		r.OK = false
		r.Failures = append(r.Failures, "no cell ran: every one was skipped (see each cell's reason)")
	}
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the terminal report: a table, the notes, the verdict.
func (r *Report) WriteText(w io.Writer) error {
	s := r.Settings
	fmt.Fprintf(w, "scheduler compare: %d replicas per cell, %d jobs (%d tick, %d long, %d billing), %v per cell, lease %v, max_clock_skew %v, seed %d\n\n",
		s.Replicas, s.Jobs, s.Workload[kindTick], s.Workload[kindLong], s.Workload[kindBilling],
		msDur(s.DurationMS), msDur(s.LeaseMS), msDur(s.MaxClockSkewMS), r.Seed)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLAIMER\tFAULT\tRESULT\tRUNS\tMISSED\tEXECS\tDUPS\tTAKEOVERS\tSTALE REJ/ACC\tCLAIM p50/p99\tTAKEOVER p50/p99\tRT/RUN")
	for _, c := range r.Cells {
		if c.Status == StatusSkipped || c.Status == StatusError {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\n", c.Claimer, c.Fault, c.Status)
			continue
		}
		result := c.Status
		if c.failed() {
			result = "FAILED"
		}
		// A random cell measures no latencies: "-", not a measured zero.
		claimLat, takeover, rtPerRun := "-", "-", "-"
		if c.ClaimLatency.Count > 0 {
			claimLat = fmtMS(c.ClaimLatency.P50MS) + "/" + fmtMS(c.ClaimLatency.P99MS)
			rtPerRun = fmt.Sprintf("%.1f", c.RoundTripsPerRun)
		}
		if c.TakeoverTime.Count > 0 {
			takeover = fmtMS(c.TakeoverTime.P50MS) + "/" + fmtMS(c.TakeoverTime.P99MS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%s\t%s\t%s\n", c.Claimer, c.Fault, result,
			c.RunsExpected, c.MissedRuns, c.Executions, c.DuplicateExecutions, c.Takeovers,
			c.StaleWritesRejected, c.StaleWritesAccepted, claimLat, takeover, rtPerRun)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	var skips []string
	skipped := map[string][]string{} // reason → cells
	for _, c := range r.Cells {
		if c.Status == StatusSkipped {
			if skipped[c.Reason] == nil {
				skips = append(skips, c.Reason)
			}
			skipped[c.Reason] = append(skipped[c.Reason], c.Claimer+" × "+c.Fault)
			continue
		}
		lines := c.Notes
		if c.Reason != "" {
			lines = append([]string{c.Status + ": " + c.Reason}, lines...)
		}
		for i, n := range lines {
			head := ""
			if i == 0 {
				head = c.Claimer + " × " + c.Fault + ":"
			}
			fmt.Fprintf(w, "%-26s %s\n", head, n)
		}
	}
	for _, why := range skips {
		fmt.Fprintf(w, "skipped (%s): %s\n", why, strings.Join(skipped[why], ", "))
	}
	stale := 0
	for _, c := range r.Cells {
		stale += c.StaleWritesAccepted
	}
	if stale > 0 {
		bar := strings.Repeat("!", 78)
		fmt.Fprintf(w, "\n%s\n!!! %d STALE WRITES ACCEPTED: a holder that had lost its claim overwrote newer work.\n!!! Fencing did not protect storage in: %s\n%s\n",
			bar, stale, strings.Join(staleCells(r), ", "), bar)
	}
	if r.OK {
		fmt.Fprintln(w, "\nOK: no duplicate executions, no missed runs, no stale writes accepted, no history violations.")
		return nil
	}
	fmt.Fprintln(w, "\nFAILED:")
	for _, f := range r.Failures {
		fmt.Fprintln(w, "  "+f)
	}
	return nil
}

func staleCells(r *Report) []string {
	var out []string
	for _, c := range r.Cells {
		if c.StaleWritesAccepted > 0 {
			out = append(out, c.Claimer+" × "+c.Fault)
		}
	}
	return out
}

// fmtMS formats milliseconds compactly: 0.42ms, 12ms, 3.1s.
func fmtMS(v float64) string {
	switch {
	case v >= 1000 || v <= -1000:
		return fmt.Sprintf("%.2gs", v/1000)
	case v >= 10 || v <= -10:
		return fmt.Sprintf("%.0fms", v)
	case v >= 1 || v <= -1:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.0fµs", v*1000)
}

func msDur(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
