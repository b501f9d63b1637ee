package compare

import (
	"cmp"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// palette colours replicas on timelines and claimers on charts.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"}

const htmlHead = `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>scheduler compare</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f3f3f3}td.l,th.l{text-align:left}
tr.failed td{background:#fde2e2}tr.skipped td,tr.error td{color:#888}
.verdict{font-size:18px;font-weight:bold;padding:8px 12px;display:inline-block}
.ok{background:#dff5df}.bad{background:#fde2e2}
.loud{background:#b00020;color:#fff;font-weight:bold;padding:10px;margin:12px 0}
ul.notes,ul.violations{margin:4px 0 12px;font-size:13px}ul.violations li{white-space:pre-wrap;font-family:monospace}
svg text{font:11px system-ui,sans-serif}
details{margin:10px 0}summary{cursor:pointer;font-weight:bold}
</style></head><body>
`

// WriteHTML writes a self-contained HTML report: the summary table, claim
// latency distributions per claimer, and per cell a timeline of who held
// what. Plain HTML and inline SVG: no script, nothing fetched.
func (r *Report) WriteHTML(w io.Writer) error {
	var b strings.Builder
	b.WriteString(htmlHead)
	s := r.Settings
	fmt.Fprintf(&b, "<h1>scheduler compare</h1>\n<p>%s · %d replicas per cell · %d jobs (%d tick, %d long, %d billing) · %v per cell · lease %v · max_clock_skew %v · seed %d</p>\n",
		html.EscapeString(r.StartedAt.Format(time.RFC3339)), s.Replicas, s.Jobs, s.Workload[kindTick], s.Workload[kindLong],
		s.Workload[kindBilling], msDur(s.DurationMS), msDur(s.LeaseMS), msDur(s.MaxClockSkewMS), r.Seed)
	if stale := staleCells(r); len(stale) > 0 {
		fmt.Fprintf(&b, "<div class=\"loud\">STALE WRITES ACCEPTED: fencing did not protect storage in %s</div>\n", html.EscapeString(strings.Join(stale, ", ")))
	}
	if r.OK {
		b.WriteString(`<div class="verdict ok">OK: no duplicate executions, no missed runs, no stale writes accepted, no history violations</div>` + "\n")
	} else {
		b.WriteString(`<div class="verdict bad">FAILED</div><ul>` + "\n")
		for _, f := range r.Failures {
			fmt.Fprintf(&b, "<li>%s</li>\n", html.EscapeString(f))
		}
		b.WriteString("</ul>\n")
	}
	r.htmlTable(&b)
	b.WriteString("<h2>Claim latency</h2>\n<p>Every Claim call (won, held, done or failed), all fault scenarios of a claimer pooled. Log scale.</p>\n")
	r.latencyCDF(&b)
	r.latencyBars(&b)
	b.WriteString("<h2>Timelines: who held what</h2>\n<p>One row per job; each bar is an execution, coloured by replica. Red outline: duplicate. Faded: ended without success. Dashed: never finished (crash or end of cell). Shaded: steady window. Bands and lines: faults.</p>\n")
	for _, c := range r.Cells {
		// A random cell has no timeline, but its plan, replay command
		// and violations are what its reader needs.
		if len(c.spans) == 0 && len(c.Notes) == 0 && len(c.Violations) == 0 {
			continue
		}
		open := ""
		if c.Status != StatusOK || c.Fault != FaultNone {
			open = " open"
		}
		fmt.Fprintf(&b, "<details%s><summary>%s × %s: %s</summary>\n", open, html.EscapeString(c.Claimer), html.EscapeString(c.Fault), html.EscapeString(c.Status))
		for _, list := range []struct {
			class string
			items []string
		}{{"notes", c.Notes}, {"violations", c.Violations}} {
			if len(list.items) == 0 {
				continue
			}
			fmt.Fprintf(&b, "<ul class=%q>", list.class)
			for _, n := range list.items {
				fmt.Fprintf(&b, "<li>%s</li>", html.EscapeString(n))
			}
			b.WriteString("</ul>\n")
		}
		if len(c.spans) > 0 {
			timeline(&b, c, s.Replicas)
		}
		b.WriteString("</details>\n")
	}
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) htmlTable(b *strings.Builder) {
	b.WriteString(`<h2>Results</h2><table><tr><th class="l">claimer</th><th class="l">fault</th><th class="l">result</th>` +
		`<th>runs</th><th>missed</th><th>execs</th><th>dups</th><th>takeovers</th><th>lease lost</th><th>stale rejected</th>` +
		`<th>stale accepted</th><th>claim p50</th><th>claim p99</th><th>takeover p50</th><th>takeover p99</th><th>round trips/run</th></tr>` + "\n")
	for _, c := range r.Cells {
		fmt.Fprintf(b, `<tr class="%s"><td class="l">%s</td><td class="l">%s</td><td class="l">%s</td>`, c.Status,
			html.EscapeString(c.Claimer), html.EscapeString(c.Fault), html.EscapeString(c.Status))
		if c.Status == StatusSkipped || c.Status == StatusError {
			fmt.Fprintf(b, "<td colspan=\"13\" class=\"l\">%s</td></tr>\n", html.EscapeString(c.Reason))
			continue
		}
		take50, take99 := "-", "-"
		if c.TakeoverTime.Count > 0 {
			take50, take99 = fmtMS(c.TakeoverTime.P50MS), fmtMS(c.TakeoverTime.P99MS)
		}
		fmt.Fprintf(b, "<td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%.1f</td></tr>\n",
			c.RunsExpected, c.MissedRuns, c.Executions, c.DuplicateExecutions, c.Takeovers, c.LeaseLost,
			c.StaleWritesRejected, c.StaleWritesAccepted, fmtMS(c.ClaimLatency.P50MS), fmtMS(c.ClaimLatency.P99MS),
			take50, take99, c.RoundTripsPerRun)
	}
	b.WriteString("</table>\n")
}

// logAxis maps milliseconds onto [x0, x0+width] on a log10 scale.
type logAxis struct {
	lo, hi    float64 // log10 of the bounds, in ms
	x0, width float64
}

func newLogAxis(minMS, maxMS, x0, width float64) logAxis {
	lo := math.Floor(math.Log10(max(minMS, 0.001)))
	hi := math.Ceil(math.Log10(max(maxMS, minMS*10, 0.01)))
	if hi <= lo {
		hi = lo + 1
	}
	return logAxis{lo: lo, hi: hi, x0: x0, width: width}
}

func (a logAxis) x(v float64) float64 {
	l := math.Log10(max(v, math.Pow(10, a.lo)))
	return a.x0 + (l-a.lo)/(a.hi-a.lo)*a.width
}

func (a logAxis) ticks(b *strings.Builder, top, bottom float64) {
	for e := a.lo; e <= a.hi; e++ {
		x := a.x(math.Pow(10, e))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, x, top, x, bottom)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x, bottom+14, fmtMS(math.Pow(10, e)))
	}
}

// latencyCDF draws, per claimer, the cumulative distribution of claim call
// latency over all its cells.
func (r *Report) latencyCDF(b *strings.Builder) {
	pooled := map[string][]time.Duration{}
	var all []time.Duration
	for _, c := range r.Cells {
		pooled[c.Claimer] = append(pooled[c.Claimer], c.claimLat...)
		all = append(all, c.claimLat...)
	}
	if len(all) == 0 {
		b.WriteString("<p>No claim calls recorded.</p>\n")
		return
	}
	const W, H, left, top, plotW, plotH = 900.0, 300.0, 50.0, 15.0, 700.0, 240.0
	ax := newLogAxis(ms(slices.Min(all)), ms(slices.Max(all)), left, plotW)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" role="img" aria-label="claim latency CDF">`, W, H)
	ax.ticks(b, top, top+plotH)
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		y := top + plotH*(1-q)
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%g%%</text>`,
			left, y, left+plotW, y, left-4, y+4, q*100)
	}
	for i, k := range r.Settings.Claimers {
		s := slices.Clone(pooled[k])
		if len(s) == 0 {
			continue
		}
		slices.Sort(s)
		color := palette[i%len(palette)]
		var pts []string
		step := max(1, len(s)/300)
		for j := 0; j < len(s); j += step {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", ax.x(ms(s[j])), top+plotH*(1-float64(j+1)/float64(len(s)))))
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", ax.x(ms(s[len(s)-1])), top))
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, color, strings.Join(pts, " "))
		fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s (%d calls)</text>`,
			left+plotW+15, top+float64(i)*18, color, left+plotW+32, top+float64(i)*18+10, html.EscapeString(k), len(s))
	}
	b.WriteString("</svg>\n")
}

// latencyBars draws p50–p99 of claim latency per cell, one row each.
func (r *Report) latencyBars(b *strings.Builder) {
	var cells []*Cell
	lo, hi := math.Inf(1), 0.0
	for _, c := range r.Cells {
		if c.ClaimLatency.Count > 0 {
			cells = append(cells, c)
			lo, hi = min(lo, max(c.ClaimLatency.P50MS, 0.001)), max(hi, c.ClaimLatency.P99MS)
		}
	}
	if len(cells) == 0 {
		return
	}
	const left, plotW, row = 200.0, 600.0, 16.0
	H := float64(len(cells))*row + 30
	ax := newLogAxis(lo, hi, left, plotW)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="900" height="%.0f" role="img" aria-label="claim latency p50 to p99 per cell">`, H)
	ax.ticks(b, 0, H-20)
	for i, c := range cells {
		y := float64(i)*row + 8
		color := palette[max(0, slices.Index(r.Settings.Claimers, c.Claimer))%len(palette)]
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s × %s</text>`, left-6, y+4, html.EscapeString(c.Claimer), html.EscapeString(c.Fault))
		x1, x2 := ax.x(c.ClaimLatency.P50MS), ax.x(c.ClaimLatency.P99MS)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="4"/><circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>`,
			x1, y, max(x2, x1+1), y, color, x1, y, color)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f">%s / %s</text>`, max(x2, x1)+8, y+4, fmtMS(c.ClaimLatency.P50MS), fmtMS(c.ClaimLatency.P99MS))
	}
	b.WriteString("</svg>\n")
}

// timeline draws one cell's executions: a row per job, bars coloured by
// replica, faults as bands (with a duration) or lines.
func timeline(b *strings.Builder, c *Cell, replicas int) {
	jobs := map[string]int{}
	var names []string
	for _, s := range c.spans {
		if _, ok := jobs[s.job]; !ok {
			jobs[s.job] = 0
			names = append(names, s.job)
		}
	}
	slices.Sort(names)
	for i, n := range names {
		jobs[n] = i
	}
	const left, plotW, row = 90.0, 820.0, 11.0
	top := 20.0
	plotH := float64(len(names)) * row
	H := top + plotH + 40
	span := c.DurationMS
	for _, s := range c.spans {
		span = max(span, s.to)
	}
	x := func(v float64) float64 { return left + max(v, 0)/span*plotW }
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" role="img" aria-label="timeline">`, left+plotW+20, H)
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f4f8ff"/>`, x(c.SteadyWindowMS[0]), top,
		x(c.SteadyWindowMS[1])-x(c.SteadyWindowMS[0]), plotH)
	for sec := 0.0; sec <= span; sec += 5000 {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e4e4e4"/><text x="%.1f" y="%.1f" text-anchor="middle">%gs</text>`,
			x(sec), top, x(sec), top+plotH, x(sec), top+plotH+13, sec/1000)
	}
	for i, n := range names {
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`, left-4, top+float64(i)*row+9, html.EscapeString(n))
	}
	for _, f := range c.FaultEvents {
		if f.Kind == FaultLatency {
			continue
		}
		if f.DurationMS > 0 && f.Kind != FaultRedisRestart {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#ffcc00" fill-opacity="0.25"><title>%s %s</title></rect>`,
				x(f.AtMS), top-6, max(1, x(f.AtMS+f.DurationMS)-x(f.AtMS)), plotH+6, f.Kind, html.EscapeString(f.Replica))
		} else {
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#b00020" stroke-dasharray="3,2"><title>%s %s</title></line>`,
				x(f.AtMS), top-6, x(f.AtMS), top+plotH, f.Kind, html.EscapeString(f.Replica))
		}
		if f.Kind != FaultReset {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" fill="#b00020">%s %s</text>`, x(f.AtMS)+2, top-8, f.Kind, html.EscapeString(f.Replica))
		}
	}
	for _, s := range c.spans {
		var ri int
		_, _ = fmt.Sscanf(s.replica, "r%d", &ri)
		color := palette[max(ri-1, 0)%len(palette)]
		y := top + float64(jobs[s.job])*row + 1
		attrs := ""
		if s.status != "succeeded" {
			attrs += ` fill-opacity="0.4"`
		}
		switch {
		case s.dup:
			attrs += ` stroke="#d00" stroke-width="1.5"`
		case s.open:
			attrs += ` stroke="#333" stroke-dasharray="2,1"`
		}
		title := ""
		if s.dup || s.open || s.status != "succeeded" || s.attempt > 1 {
			title = fmt.Sprintf("<title>%s %s attempt %d %s</title>", html.EscapeString(s.job), html.EscapeString(s.replica), s.attempt, html.EscapeString(cmp.Or(s.status, "unfinished")))
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"%s>%s</rect>`,
			x(s.from), y, max(1.5, x(s.to)-x(s.from)), row-2, color, attrs, title)
	}
	for i := range replicas {
		fmt.Fprintf(b, `<rect x="%.0f" y="%.1f" width="10" height="10" fill="%s"/><text x="%.0f" y="%.1f">r%d</text>`,
			left+float64(i)*50, H-12, palette[i%len(palette)], left+float64(i)*50+14, H-3, i+1)
	}
	b.WriteString("</svg>\n")
}
