package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// What a rule file or a dashboard may name beyond the scheduler's own
// families: `up` is Prometheus's per-target series (SchedulerNoReplicaUp,
// the dashboard's replica count and instance variable).
var prometheusSynthetic = []string{"up"}

// notExportedYet are metrics alerts.yaml may name before any code exports
// them (none today); drop a name from here once it is exported.
var notExportedYet []string

// recorder is a Registerer that keeps what is registered with it, so the
// families can be listed from their descriptors, without observations.
type recorder struct {
	reg        *prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func descNames(c prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var names []string
	for d := range ch {
		if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

// seriesNames are the names a family of this type shows up under in
// Prometheus: a classic histogram only as _bucket, _sum and _count.
func seriesNames(name string, typ dto.MetricType) []string {
	switch typ {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		return []string{name + "_bucket", name + "_sum", name + "_count"}
	case dto.MetricType_SUMMARY:
		return []string{name, name + "_sum", name + "_count"}
	}
	return []string{name}
}

// exportedNames lists the series names a replica's /metrics carries, from
// the code: the runner's families (as cli/run.go registers them) and the
// Go and process collectors beside them.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	rec := &recorder{reg: prometheus.NewRegistry()}
	runner.NewMetrics(rec)
	if len(rec.collectors) == 0 {
		t.Fatal("runner.NewMetrics registered nothing")
	}
	names := map[string]bool{}
	for _, c := range rec.collectors {
		var typ dto.MetricType
		switch c.(type) {
		case *prometheus.CounterVec:
			typ = dto.MetricType_COUNTER
		case *prometheus.GaugeVec, prometheus.Gauge:
			typ = dto.MetricType_GAUGE
		case *prometheus.HistogramVec:
			typ = dto.MetricType_HISTOGRAM
		case *prometheus.SummaryVec:
			typ = dto.MetricType_SUMMARY
		default:
			t.Fatalf("runner registers a %T: teach exportedNames its series names", c)
		}
		for _, n := range descNames(c) {
			for _, s := range seriesNames(n, typ) {
				names[s] = true
			}
		}
	}

	// The Go and process collectors: every name they describe, expanded by
	// the type they gather with where they gather (the process collector
	// gathers nothing off Linux).
	std := prometheus.NewRegistry()
	goc := collectors.NewGoCollector()
	proc := collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})
	std.MustRegister(goc, proc)
	for _, c := range []prometheus.Collector{goc, proc} {
		for _, n := range descNames(c) {
			names[n] = true
		}
	}
	fams, err := std.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, s := range seriesNames(f.GetName(), f.GetType()) {
			names[s] = true
		}
	}
	for _, n := range prometheusSynthetic {
		names[n] = true
	}
	return names
}

// PromQL words that are not metric names. Aggregations may be followed by
// `by (...)` before their parenthesis, so they are listed as well as
// matched as functions.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"inf": true, "nan": true, "start": true, "end": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// Keywords followed by a parenthesised list of label names.
var promqlLabelLists = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

func isIdent(c byte) bool { return isIdentStart(c) || ('0' <= c && c <= '9') }

// skipTo returns the index after the close that balances the open at s[i],
// skipping quoted strings.
func skipTo(s string, i int, open, close byte) (int, error) {
	depth := 0
	for j := i; j < len(s); j++ {
		switch c := s[j]; c {
		case '"', '\'', '`':
			k, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = k - 1
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unbalanced %q at %d in %q", open, i, s)
}

func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if q != '`' {
				j++
			}
		case q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d in %q", i, s)
}

// metricNames returns the metric names a PromQL expression selects: the
// identifiers that are not functions (followed by "("), keywords, label
// names (inside {...} or after by/on/...), durations (inside [...] or after
// offset), numbers, strings or Grafana variables ($x, ${x}).
func metricNames(expr string) ([]string, error) {
	var names []string
	s := expr
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			j, err := skipTo(s, i, '{', '}')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j, err := skipTo(s, i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				j, err := skipTo(s, i, '{', '}')
				if err != nil {
					return nil, err
				}
				i = j
				continue
			}
			for i < len(s) && isIdent(s[i]) {
				i++
			}
		case '0' <= c && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && strings.ContainsRune(" \t\r\n", rune(s[k])) {
				k++
			}
			next := byte(0)
			if k < len(s) {
				next = s[k]
			}
			lower := strings.ToLower(word)
			switch {
			case promqlLabelLists[lower]:
				if next == '(' {
					end, err := skipTo(s, k, '(', ')')
					if err != nil {
						return nil, err
					}
					j = end
				}
			case promqlKeywords[lower], next == '(':
			default:
				names = append(names, word)
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

// unknownMetrics returns what the expressions name that is neither known
// nor allowed, as "name (in expr)".
func unknownMetrics(exprs []string, known map[string]bool) ([]string, error) {
	var bad []string
	for _, e := range exprs {
		names, err := metricNames(e)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if !known[n] {
				bad = append(bad, fmt.Sprintf("%s (in %q)", n, e))
			}
		}
	}
	return bad, nil
}

func TestMetricNamesFromPromQL(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (job, le) (rate(a_bucket{job=~"$job", le!="+Inf"}[$__rate_interval]))`, []string{"a_bucket"}},
		{`histogram_quantile(0.99, sum(rate(b_bucket[5m:1m])) by (le)) > 5`, []string{"b_bucket"}},
		{`x > on (job) group_left () (y or on(job) 0 * x + 26 * 3600)`, []string{"x", "y", "x"}},
		{`c unless c offset 15m`, []string{"c", "c"}},
		{`(sum(up{job="scheduler"}) or vector(0)) == 0`, []string{"up"}},
		{`time() - max by (job) (rec:name_seconds{job=~"${job}"}) # max by (nope)`, []string{"rec:name_seconds"}},
		{`label_replace(d, "dst", "$1", "src", "(.*)") and bool e`, []string{"d", "e"}},
		{`topk(5, f) / ignoring(instance) g @ end()`, []string{"f", "g"}},
		{`1e-3 + Inf - NaN`, nil},
	} {
		got, err := metricNames(c.expr)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("metricNames(%q) = %q, %v; want %q", c.expr, got, err, c.want)
		}
	}
	for _, bad := range []string{`a{job="x"`, `rate(a[5m)`, `a{job="x}`} {
		if _, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q): no error", bad)
		}
	}
}

// The check fails on a name the scheduler does not export: a typo in a
// panel, a histogram named without its _bucket.
func TestUnknownMetricsAreCaught(t *testing.T) {
	known := exportedNames(t)
	for _, expr := range []string{
		`sum by (job, status) (rate(scheduler_runs_totl{job=~"$job"}[$__rate_interval]))`,
		`histogram_quantile(0.99, sum by (le) (rate(scheduler_schedule_lag_seconds[5m])))`,
		`scheduler_schedule_conflict_total`, // singular
		`sum(rate(go_gorutines[5m]))`,
	} {
		bad, err := unknownMetrics([]string{expr}, known)
		if err != nil {
			t.Fatal(err)
		}
		if len(bad) != 1 {
			t.Errorf("unknownMetrics(%q) = %q; want the one wrong name", expr, bad)
		}
	}
	for _, expr := range []string{
		`sum by (job, status) (rate(scheduler_runs_total{job=~"$job"}[$__rate_interval]))`,
		`histogram_quantile(0.99, sum by (le) (rate(scheduler_schedule_lag_seconds_bucket[5m])))`,
		`sum by (instance) (scheduler_runs_held) + go_goroutines * 0 + process_resident_memory_bytes * 0`,
	} {
		if bad, err := unknownMetrics([]string{expr}, known); err != nil || len(bad) != 0 {
			t.Errorf("unknownMetrics(%q) = %q, %v; want none", expr, bad, err)
		}
	}
}

// grafanaVariableExpr turns a Grafana Prometheus variable query into the
// PromQL it evaluates: label_values(selector, label) -> selector;
// query_result(expr) -> expr; label_values(label), label_names() -> "".
func grafanaVariableExpr(q string) (string, error) {
	q = strings.TrimSpace(q)
	inner := func(prefix string) (string, bool) {
		if !strings.HasPrefix(q, prefix+"(") || !strings.HasSuffix(q, ")") {
			return "", false
		}
		return q[len(prefix)+1 : len(q)-1], true
	}
	if args, ok := inner("label_values"); ok {
		// The label is the last top-level argument.
		depth := 0
		for i := len(args) - 1; i >= 0; i-- {
			switch args[i] {
			case ')', '}', ']':
				depth++
			case '(', '{', '[':
				depth--
			case ',':
				if depth == 0 {
					return args[:i], nil
				}
			}
		}
		return "", nil
	}
	if e, ok := inner("query_result"); ok {
		return e, nil
	}
	if _, ok := inner("label_names"); ok {
		return "", nil
	}
	return "", fmt.Errorf("variable query %q: not label_values, query_result or label_names", q)
}

type dashboard struct {
	raw        map[string]any
	exprs      []string // every targets[].expr, in panels and rows
	varExprs   []string // the PromQL of the query variables
	panels     []map[string]any
	variables  map[string]map[string]any
	targetless []string
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/scheduler.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d.raw); err != nil {
		t.Fatalf("grafana/scheduler.json: %v", err)
	}
	var walk func(ps []any)
	walk = func(ps []any) {
		for _, p := range ps {
			panel, _ := p.(map[string]any)
			d.panels = append(d.panels, panel)
			if nested, ok := panel["panels"].([]any); ok { // a row's panels
				walk(nested)
			}
			if panel["type"] == "row" {
				continue
			}
			targets, _ := panel["targets"].([]any)
			if len(targets) == 0 {
				d.targetless = append(d.targetless, fmt.Sprint(panel["title"]))
			}
			for _, tg := range targets {
				expr, _ := tg.(map[string]any)["expr"].(string)
				d.exprs = append(d.exprs, expr)
			}
		}
	}
	panels, _ := d.raw["panels"].([]any)
	walk(panels)

	d.variables = map[string]map[string]any{}
	templating, _ := d.raw["templating"].(map[string]any)
	list, _ := templating["list"].([]any)
	for _, v := range list {
		v, _ := v.(map[string]any)
		d.variables[fmt.Sprint(v["name"])] = v
		if v["type"] != "query" {
			continue
		}
		q := v["query"]
		if m, ok := q.(map[string]any); ok { // the current editor's form
			q = m["query"]
		}
		qs, _ := q.(string)
		e, err := grafanaVariableExpr(qs)
		if err != nil {
			t.Fatalf("variable %v: %v", v["name"], err)
		}
		if e != "" {
			d.varExprs = append(d.varExprs, e)
		}
		if def, ok := v["definition"].(string); ok && def != qs {
			t.Errorf("variable %v: definition %q differs from its query %q", v["name"], def, qs)
		}
	}
	return d
}

func TestDashboardNamesOnlyExportedMetrics(t *testing.T) {
	d := loadDashboard(t)
	if len(d.exprs) == 0 || len(d.varExprs) == 0 {
		t.Fatalf("found %d panel and %d variable expressions", len(d.exprs), len(d.varExprs))
	}
	for i, e := range d.exprs {
		if strings.TrimSpace(e) == "" {
			t.Errorf("target %d has no expr", i)
		}
	}
	known := exportedNames(t)
	bad, err := unknownMetrics(append(slices.Clone(d.exprs), d.varExprs...), known)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Errorf("the dashboard names a metric the scheduler does not export: %s", b)
	}

	// And it shows what operators need to see.
	used := map[string]bool{}
	for _, e := range d.exprs {
		names, _ := metricNames(e)
		for _, n := range names {
			used[n] = true
		}
	}
	for _, want := range []string{
		"scheduler_runs_total", "scheduler_schedule_lag_seconds_bucket", "scheduler_claim_duration_seconds_bucket",
		"scheduler_lease_renewals_total", "scheduler_runs_held", "scheduler_runs_missed_total",
		"scheduler_claimer_data_loss_total", "scheduler_job_last_success_timestamp_seconds",
	} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

func TestDashboardIsPortable(t *testing.T) {
	d := loadDashboard(t)
	if v, _ := d.raw["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v: want 36 or later (datasource references by uid)", d.raw["schemaVersion"])
	}
	if ds := d.variables["datasource"]; ds == nil || ds["type"] != "datasource" || ds["query"] != "prometheus" {
		t.Errorf("no Prometheus datasource variable: %v", ds)
	}
	for _, name := range []string{"job", "instance"} {
		if v := d.variables[name]; v == nil || v["type"] != "query" {
			t.Errorf("no query variable %q", name)
		}
	}
	if len(d.targetless) > 0 {
		t.Errorf("panels without queries: %q", d.targetless)
	}
	ids := map[float64]bool{}
	wantDS := map[string]any{"type": "prometheus", "uid": "${datasource}"}
	checkDS := func(where string, ds any) {
		if !reflect.DeepEqual(ds, wantDS) {
			t.Errorf("%s: datasource %v, want %v", where, ds, wantDS)
		}
	}
	for _, p := range d.panels {
		id, _ := p["id"].(float64)
		if ids[id] {
			t.Errorf("panel id %v used twice", id)
		}
		ids[id] = true
		if _, ok := p["gridPos"].(map[string]any); !ok {
			t.Errorf("panel %v has no gridPos", p["title"])
		}
		if p["type"] == "row" {
			continue
		}
		checkDS(fmt.Sprintf("panel %v", p["title"]), p["datasource"])
		targets, _ := p["targets"].([]any)
		for _, tg := range targets {
			checkDS(fmt.Sprintf("panel %v target", p["title"]), tg.(map[string]any)["datasource"])
		}
	}
	for name, v := range d.variables {
		if v["type"] == "query" {
			checkDS("variable "+name, v["datasource"])
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestAlertsNameOnlyExportedMetrics(t *testing.T) {
	var rf ruleFile
	loadYAML(t, "prometheus/alerts.yaml", &rf)
	known := exportedNames(t)
	for _, n := range notExportedYet {
		if known[n] {
			// Not a failure: whoever exports it should drop the exception.
			t.Logf("%s is exported now: drop it from notExportedYet", n)
		}
	}
	allowed := map[string]bool{}
	for n := range known {
		allowed[n] = true
	}
	for _, n := range notExportedYet {
		allowed[n] = true
	}
	var exprs, alerts []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				allowed[r.Record] = true // recorded in this file
			}
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs summary and description", r.Alert)
			}
		}
	}
	bad, err := unknownMetrics(exprs, allowed)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Errorf("alerts.yaml names a metric the scheduler does not export: %s", b)
	}
	sort.Strings(alerts)
	want := []string{"SchedulerClaimErrors", "SchedulerClaimerDataLoss", "SchedulerJobNoRecentSuccess",
		"SchedulerNoReplicaUp", "SchedulerReplicasApart", "SchedulerRunsLeaseLost", "SchedulerRunsMissed", "SchedulerScheduleConflicts",
		"SchedulerScheduleLagHigh"}
	if !slices.Equal(alerts, want) {
		t.Errorf("alerts %q, want %q (update docs/alerting.md and alerts_test.yaml too)", alerts, want)
	}
}

func TestPrometheusRuleEqualsAlertsYAML(t *testing.T) {
	var file map[string]any
	loadYAML(t, "prometheus/alerts.yaml", &file)
	var cr struct {
		APIVersion string         `yaml:"apiVersion"`
		Kind       string         `yaml:"kind"`
		Spec       map[string]any `yaml:"spec"`
	}
	loadYAML(t, "k8s/prometheusrule.yaml", &cr)
	if cr.APIVersion != "monitoring.coreos.com/v1" || cr.Kind != "PrometheusRule" {
		t.Errorf("k8s/prometheusrule.yaml is a %s %s", cr.APIVersion, cr.Kind)
	}
	if len(file) != 1 || file["groups"] == nil {
		t.Fatalf("alerts.yaml: want only groups, have %v", slices.Sorted(func(yield func(string) bool) {
			for k := range file {
				if !yield(k) {
					return
				}
			}
		}))
	}
	if len(cr.Spec) != 1 || !reflect.DeepEqual(cr.Spec["groups"], file["groups"]) {
		a, _ := yaml.Marshal(file["groups"])
		b, _ := yaml.Marshal(cr.Spec["groups"])
		al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
		for i := range max(len(al), len(bl)) {
			x, y := "", ""
			if i < len(al) {
				x = al[i]
			}
			if i < len(bl) {
				y = bl[i]
			}
			if x != y {
				t.Fatalf("k8s/prometheusrule.yaml spec.groups differ from prometheus/alerts.yaml groups at line %d:\n alerts.yaml:        %q\n prometheusrule.yaml: %q", i+1, x, y)
			}
		}
		t.Fatalf("k8s/prometheusrule.yaml spec differs from prometheus/alerts.yaml: spec keys %d", len(cr.Spec))
	}
}

// promtool checks the rule file and runs its unit tests (alerts_test.yaml).
func TestAlertRulesWithPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Missing(t, "promtool", "not on PATH; .ci/run installs Debian's prometheus package")
	}
	for _, args := range [][]string{
		{"check", "rules", "prometheus/alerts.yaml"},
		{"test", "rules", "prometheus/alerts_test.yaml"},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
}
