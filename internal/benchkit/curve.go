package benchkit

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// WriteCurveSVG plots the scale scenarios' schedule lag against the jobs
// due at one instant, both on log scales: one line per claimer and
// replica count, solid for p99, dotted for p50, so the cost curve (linear
// or worse, and where it bends) shows at a glance. A scenario that left
// runs unstarted (timed out, or missed past the late tolerance) is drawn
// hollow: its lag is that of the runs that did start. Scenarios that
// started no run are left out.
func (r *Report) WriteCurveSVG(w io.Writer) error {
	type key struct {
		claimer  string
		replicas int
	}
	lines := map[key][]Scale{}
	minJobs, maxJobs, minLag, maxLag := math.Inf(1), 1.0, math.Inf(1), 1.0
	for _, s := range r.Scale {
		if s.LagP99ms <= 0 {
			continue
		}
		k := key{s.Claimer, s.Replicas}
		lines[k] = append(lines[k], s)
		minJobs, maxJobs = min(minJobs, float64(s.Jobs)), max(maxJobs, float64(s.Jobs))
		minLag, maxLag = min(minLag, max(s.LagP50ms, 1)), max(maxLag, s.LagP99ms)
	}
	if len(lines) == 0 {
		return fmt.Errorf("no scale scenario to plot")
	}
	const (
		left, right, top, bottom = 70.0, 190.0, 60.0, 50.0
		width, height            = 900.0, 520.0
	)
	x0, x1 := math.Floor(math.Log10(minJobs)), math.Max(math.Ceil(math.Log10(maxJobs)), math.Floor(math.Log10(minJobs))+1)
	y0, y1 := math.Floor(math.Log10(minLag)), math.Max(math.Ceil(math.Log10(maxLag)), math.Floor(math.Log10(minLag))+1)
	plotW, plotH := width-left-right, height-top-bottom
	px := func(jobs float64) float64 { return left + plotW*(math.Log10(jobs)-x0)/(x1-x0) }
	py := func(ms float64) float64 { return top + plotH*(1-(math.Log10(max(ms, 1))-y0)/(y1-y0)) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">schedule lag against runs due at one instant, log-log</text>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="38" fill="#555">%s · %s · solid: p99, dotted: p50; hollow: runs left unstarted; dashed: linear growth</text>`+"\n",
		esc(r.Host), r.When.UTC().Format(time.RFC3339))
	for d := x0; d <= x1; d++ {
		gx := px(math.Pow(10, d))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", gx, top, gx, top+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", gx, top+plotH+16, count(math.Pow(10, d)))
	}
	for d := y0; d <= y1; d++ {
		gy := py(math.Pow(10, d))
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", left, gy, left+plotW, gy)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", left-6, gy+4, millis(math.Pow(10, d)))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">runs due at one instant</text>`+"\n", left+plotW/2, height-12)
	// Linear growth through the lowest p99 of the smallest size.
	var first Scale
	for _, ss := range lines {
		for _, s := range ss {
			if first.Jobs == 0 || s.Jobs < first.Jobs || s.Jobs == first.Jobs && s.LagP99ms < first.LagP99ms {
				first = s
			}
		}
	}
	lin := func(jobs float64) float64 { return first.LagP99ms * jobs / float64(first.Jobs) }
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="6 4"/>`+"\n",
		px(float64(first.Jobs)), py(lin(float64(first.Jobs))), px(maxJobs), py(min(lin(maxJobs), math.Pow(10, y1))))

	keys := make([]key, 0, len(lines))
	for k := range lines {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.claimer, b.claimer), cmp.Compare(a.replicas, b.replicas))
	})
	palette := []string{"#1f5fa8", "#c0641a", "#2e8b57", "#8e44ad", "#b22222", "#555555", "#d4a017", "#008b8b", "#e377c2", "#17becf", "#7f7f00", "#000000"}
	for i, k := range keys {
		ss := lines[k]
		slices.SortFunc(ss, func(a, b Scale) int { return cmp.Compare(a.Jobs, b.Jobs) })
		col := palette[i%len(palette)]
		var p99, p50 []string
		for _, s := range ss {
			p99 = append(p99, fmt.Sprintf("%.1f,%.1f", px(float64(s.Jobs)), py(s.LagP99ms)))
			p50 = append(p50, fmt.Sprintf("%.1f,%.1f", px(float64(s.Jobs)), py(s.LagP50ms)))
			fill := col
			if s.Error != "" || s.Missing > 0 {
				fill = "white"
			}
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s" stroke="%s" stroke-width="1.5"/>`+"\n",
				px(float64(s.Jobs)), py(s.LagP99ms), fill, col)
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(p99, " "), col)
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="2 3"/>`+"\n", strings.Join(p50, " "), col)
		ly := top + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"/>`+"\n", left+plotW+15, ly, left+plotW+40, ly, col)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s × %d replicas</text>`+"\n", left+plotW+46, ly+4, esc(k.claimer), k.replicas)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// millis labels a lag axis tick.
func millis(ms float64) string {
	if ms >= 1000 {
		return fmt.Sprintf("%gs", ms/1000)
	}
	return fmt.Sprintf("%gms", ms)
}
