package benchkit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is everything one run of the suite measured.
type Report struct {
	When    time.Time `json:"when"`
	Host    string    `json:"host"`
	Rows    []Row     `json:"rows"`
	Targets []Target  `json:"targets"`
	Scale   []Scale   `json:"scale,omitempty"`
	// ScaleTargets are the goals for the scale scenario, judged on its
	// 10,000 × 3 replica processes row of each claimer.
	ScaleTargets []ScaleTarget `json:"scale_targets,omitempty"`
}

// Target is one of the goals: Row's ops/s over Of's at
// Concurrency, whatever their round trips. When the two were measured in
// different processes (a peer), each is first divided by the same
// reference measured in turns with it in its own process (RowRef, OfRef),
// so that load which differed between the two processes cancels out; Direct
// is the undivided ratio.
type Target struct {
	Row         string  `json:"row"`
	Of          string  `json:"of"`
	RowRef      string  `json:"row_ref,omitempty"`
	OfRef       string  `json:"of_ref,omitempty"`
	Concurrency int     `json:"concurrency"`
	Want        float64 `json:"want"`
	Got         float64 `json:"got"`
	Direct      float64 `json:"direct"`
	Met         bool    `json:"met"`
	Known       bool    `json:"known"` // every row needed was measured
}

// Peer row names, written by the nested bench module.
const (
	PeerRedislock = "bsm/redislock"
	PeerRedsync1  = "redsync (1 node)"
	PeerRedsync5  = "redsync (5 nodes)"
)

// PeerRun ends the names of the reference rows the nested bench module
// measures in turns with the peers.
const PeerRun = " (bench/)"

// targets are performance round two's (issue 18), every one of them, so
// that one run says which are met.
var targets = []Target{
	{Row: "redis", Of: RefGoRedis, Want: 0.9, Concurrency: 1},
	{Row: "redis", Of: RefGoRedis, Want: 0.9, Concurrency: 16},
	{Row: "redis", Of: PeerRedislock, Want: 1.0, RowRef: RefGoRedis, OfRef: RefGoRedis + PeerRun, Concurrency: 1},
	{Row: RowPostgresClaim, Of: RefPgxInsert, Want: 0.9, Concurrency: 1},
	{Row: RowRedlock, Of: PeerRedsync5, Want: 1.0, RowRef: RefGoRedis5, OfRef: RefGoRedis5 + PeerRun, Concurrency: 1},
	{Row: RowRedlock, Of: PeerRedsync5, Want: 2.0, RowRef: RefGoRedis5, OfRef: RefGoRedis5 + PeerRun, Concurrency: 16},
}

// ScaleTarget is a goal for the scale scenario at 10,000 runs due at one
// instant on 3 replica processes: a bound on one measure of a claimer's
// row. A row with a duplicate or a missing run meets nothing.
type ScaleTarget struct {
	Claimer string  `json:"claimer"`
	Measure string  `json:"measure"` // ScaleLagP99 or ScaleFairness
	Want    float64 `json:"want"`    // at most
	Got     float64 `json:"got"`
	Met     bool    `json:"met"`
	Known   bool    `json:"known"` // the row was measured
	// Note, when set, says why this measure has no bound on this claimer:
	// Want is 0 and the row is printed for the record.
	Note string `json:"note,omitempty"`
}

// The measures a ScaleTarget bounds.
const (
	ScaleLagP99   = "lag p99 (ms)"
	ScaleFairness = "max/min share"
)

// scaleTargetJobs and scaleTargetReplicas are the scale row the targets
// judge.
const (
	scaleTargetJobs     = 10_000
	scaleTargetReplicas = 3
)

var scaleTargets = []ScaleTarget{
	{Claimer: "postgres", Measure: ScaleLagP99, Want: 500},
	{Claimer: "redis", Measure: ScaleLagP99, Want: 500},
	{Claimer: "redlock", Measure: ScaleLagP99, Want: 1000},
	{Claimer: "sqlite", Measure: ScaleLagP99, Want: 1000},
	{Claimer: "postgres", Measure: ScaleFairness, Want: 1.5},
	{Claimer: "redis", Measure: ScaleFairness, Want: 1.5},
	{Claimer: "redlock", Measure: ScaleFairness, Want: 1.5},
	{Claimer: "etcd", Measure: ScaleFairness, Want: 1.5},
	{Claimer: "sqlite", Measure: ScaleFairness, Note: "no bound: its replicas share one file on one host, and the file lock's busy handler, not the runner, picks the next writer"},
}

// judgeScale fills in t from the worst of the scale rows it judges (a
// run repeated is judged by its worst measurement).
func judgeScale(t ScaleTarget, rows []Scale) ScaleTarget {
	clean := true
	for _, s := range rows {
		if s.Claimer != t.Claimer || s.Jobs != scaleTargetJobs || s.Replicas != scaleTargetReplicas || !s.Processes {
			continue
		}
		got := s.LagP99ms
		if t.Measure == ScaleFairness {
			got = s.Fairness
			if got == 0 { // a replica started no run
				got = math.Inf(1)
			}
		}
		if s.Error != "" && s.Shares == nil {
			got = math.Inf(1)
		}
		clean = clean && s.Error == "" && s.Duplicates == 0 && s.Missing == 0
		t.Got, t.Known = max(t.Got, got), true
	}
	t.Met = t.Known && t.Note == "" && clean && t.Got <= t.Want
	return t
}

// Finish fills in every row's ratio to its reference (throughput per round
// trip, same concurrency) and the targets.
func (r *Report) Finish() {
	find := func(name string, conc int) *Row {
		for i := range r.Rows {
			if x := &r.Rows[i]; x.Name == name && x.Concurrency == conc && x.Error == "" && x.OpsPerSec > 0 {
				return x
			}
		}
		return nil
	}
	for i := range r.Rows {
		x := &r.Rows[i]
		x.Ratio = 0
		if x.Ref == "" || x.Error != "" {
			continue
		}
		if ref := find(x.Ref, x.Concurrency); ref != nil {
			x.Ratio = x.OpsPerSec * float64(max(x.RoundTrips, 1)) / (ref.OpsPerSec * float64(max(ref.RoundTrips, 1)))
		}
	}
	r.Targets = nil
	for _, t := range targets {
		a, b := find(t.Row, t.Concurrency), find(t.Of, t.Concurrency)
		if a != nil && b != nil {
			t.Known, t.Direct = true, a.OpsPerSec/b.OpsPerSec
			t.Got = t.Direct
			if t.RowRef != "" {
				ar, br := find(t.RowRef, t.Concurrency), find(t.OfRef, t.Concurrency)
				t.Known = ar != nil && br != nil
				if t.Known {
					t.Got = (a.OpsPerSec / ar.OpsPerSec) / (b.OpsPerSec / br.OpsPerSec)
				}
			}
			t.Met = t.Known && t.Got >= t.Want
		}
		r.Targets = append(r.Targets, t)
	}
	r.ScaleTargets = nil
	if len(r.Scale) > 0 {
		for _, t := range scaleTargets {
			r.ScaleTargets = append(r.ScaleTargets, judgeScale(t, r.Scale))
		}
	}
}

var groupOrder = map[string]int{"claimer": 0, "peer": 1, "raw": 2}

// Sorted returns the rows grouped (claimers, peers, raw), then in the order
// they were measured, concurrencies together.
func (r *Report) Sorted() []Row {
	rows := slices.Clone(r.Rows)
	first := map[string]int{}
	for i, x := range rows {
		if _, ok := first[x.Name]; !ok {
			first[x.Name] = i
		}
	}
	slices.SortStableFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(groupOrder[a.Group], groupOrder[b.Group]),
			cmp.Compare(first[a.Name], first[b.Name]), cmp.Compare(a.Concurrency, b.Concurrency))
	})
	return rows
}

// WriteTable prints the rows, the targets and the scale scenarios.
func (r *Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "row\top\tc\tops/s\tp50\tp99\tCPU/op\tRT\t×ref\treference\t")
	for _, x := range r.Sorted() {
		if x.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t%d\t—\t—\t—\t—\t\t\terror: %s\t\n", x.Name, x.Op, x.Concurrency, clip(x.Error, 70))
			continue
		}
		ratio := ""
		if x.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", x.Ratio)
		}
		if x.Unavailable > 0 {
			x.Ref += fmt.Sprintf(" (%d ops unavailable: node timeouts)", x.Unavailable)
		}
		cpu := "—"
		if x.CPUus > 0 {
			cpu = micros(x.CPUus)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t\n", x.Name, x.Op, x.Concurrency, count(x.OpsPerSec),
			micros(x.P50us), micros(x.P99us), cpu, x.RoundTrips, ratio, x.Ref)
	}
	tw.Flush()
	fmt.Fprintln(w, "×ref = (ops/s × RT) / (reference ops/s × reference RT) at the same concurrency: throughput per round trip.")
	fmt.Fprintln(w, "CPU/op = this process's CPU time (all goroutines, GC) per operation while the row ran: the client's cost, not the server's.")
	if len(r.Targets) > 0 {
		fmt.Fprintln(w, "\ntargets (ops/s ratio at the same concurrency; across processes through the shared reference, direct ratio in brackets):")
		for _, t := range r.Targets {
			got, verdict := "not measured", "?"
			if t.Known {
				got, verdict = ratio(t.Got, t.Want), map[bool]string{true: "met", false: "MISSED"}[t.Met]
				if t.RowRef != "" {
					got += fmt.Sprintf(" (%.2f)", t.Direct)
				}
			}
			fmt.Fprintf(w, "  %-22s c=%-3d ≥ %.1f × %-36s %-12s %s\n", t.Row, t.Concurrency, t.Want, t.Of, got, verdict)
		}
	}
	if len(r.Scale) > 0 {
		fmt.Fprintln(w)
		WriteScale(w, r.Scale)
	}
	if len(r.ScaleTargets) > 0 {
		fmt.Fprintf(w, "\nscale targets (%d runs due at one instant × %d replica processes; the worst row of each claimer, and a row with a duplicate or a missing run meets nothing):\n",
			scaleTargetJobs, scaleTargetReplicas)
		for _, t := range r.ScaleTargets {
			got, verdict := "not measured", "?"
			if t.Known {
				got, verdict = fmt.Sprintf("%.2f", t.Got), map[bool]string{true: "met", false: "MISSED"}[t.Met]
			}
			switch {
			case t.Note != "":
				fmt.Fprintf(w, "  %-10s %-14s %-8s %-12s %s\n", t.Claimer, t.Measure, "", got, t.Note)
			default:
				fmt.Fprintf(w, "  %-10s %-14s ≤ %-6g %-12s %s\n", t.Claimer, t.Measure, t.Want, got, verdict)
			}
		}
	}
}

// ratio prints got to two decimals, or four where two would print the
// bound it missed (0.899 against 0.9 is not "0.90 MISSED").
func ratio(got, want float64) string {
	if s := fmt.Sprintf("%.2f", got); got >= want || s != fmt.Sprintf("%.2f", want) {
		return s
	}
	return fmt.Sprintf("%.4f", got)
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func count(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func micros(us float64) string {
	switch {
	case us == 0:
		return "—"
	case us >= 1000:
		return fmt.Sprintf("%.2fms", us/1000)
	}
	return fmt.Sprintf("%.0fµs", us)
}

// WriteJSON writes the report, indented.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteSVG draws claims/s by row as horizontal bars on a log scale, one
// bar per concurrency.
func (r *Report) WriteSVG(w io.Writer) error {
	rows := r.Sorted()
	type bar struct {
		label string
		v     float64
		c     int
		group string
	}
	var bars []bar
	maxV := 1.0
	for _, x := range rows {
		if x.Error != "" || x.OpsPerSec <= 0 {
			continue
		}
		bars = append(bars, bar{x.Name, x.OpsPerSec, x.Concurrency, x.Group})
		maxV = max(maxV, x.OpsPerSec)
	}
	const (
		left, right, top, barH, gap = 290.0, 90.0, 60.0, 14.0, 3.0
		width                       = 980.0
	)
	decades := math.Ceil(math.Log10(maxV))
	lo := 1.0 // 10^1 ops/s at the left edge
	plotW := width - left - right
	x := func(v float64) float64 {
		return plotW * max(math.Log10(v)-lo, 0) / (decades - lo)
	}
	height := top + float64(len(bars))*(barH+gap) + 50
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">claims (operations) per second, log scale</text>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="38" fill="#555">%s · %s · bars: c=1 dark, c=16 light; claimers blue, peers orange, raw references grey</text>`+"\n",
		esc(r.Host), r.When.UTC().Format(time.RFC3339))
	for d := lo; d <= decades; d++ {
		gx := left + x(math.Pow(10, d))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", gx, top-6, gx, height-40)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", gx, height-26, count(math.Pow(10, d)))
	}
	colors := map[string][2]string{"claimer": {"#1f5fa8", "#8fb6e3"}, "peer": {"#c0641a", "#efb27c"}, "raw": {"#555", "#bbb"}}
	for i, br := range bars {
		y := top + float64(i)*(barH+gap)
		col := colors[br.group][0]
		if br.c != 1 {
			col = colors[br.group][1]
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s  c=%d</text>`+"\n", left-6, y+barH-3, esc(br.label), br.c)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.1f" width="%.1f" height="%.0f" fill="%s"/>`+"\n", left, y, max(x(br.v), 1), barH, col)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", left+max(x(br.v), 1)+4, y+barH-3, count(br.v))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
