package benchkit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/benchkit"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func services(t *testing.T) benchkit.Services {
	return benchkit.Services{
		PostgresDSN:  testenv.PostgresDSN(t),
		RedisAddr:    testenv.RedisAddr(t),
		RedlockAddrs: testenv.RedlockAddrs(t, 5),
		Dir:          t.TempDir(),
	}
}

// TestBenchSmoke keeps the benchmark suite from rotting: every row and the
// scale scenario run briefly against the real backends and produce numbers.
// It asserts that they do, never how fast.
func TestBenchSmoke(t *testing.T) {
	testenv.WallClock(t)
	s := services(t)
	tools := map[string]string{benchkit.RefRedisBench: "redis-benchmark", benchkit.RefPgbench: "pgbench"}
	bad := func(r benchkit.Row) bool {
		tool, ok := tools[r.Name]
		if ok {
			if _, err := exec.LookPath(tool); err != nil && !testenv.Required() {
				return false // reported as an error row; CI has the tool
			}
		}
		// A row measured in this process has its client's CPU per op;
		// the tools, processes of their own, none.
		return r.Error != "" || r.OpsPerSec <= 0 || r.Ops <= 0 || r.P50us <= 0 || r.P99us < r.P50us ||
			(!ok) != (r.CPUus > 0)
	}
	var rows []benchkit.Row
	seen := map[string]bool{}
	for _, kind := range []string{"memory", "sqlite", "postgres", "redis", "redlock"} {
		// The services are shared with every other test package running
		// now (PostgreSQL may be out of connections for a moment): a kind
		// gets three tries to produce its rows.
		var got []benchkit.Row
		for try := 0; try < 3; try++ {
			got = benchkit.Claimers(t.Context(), s, benchkit.Options{Duration: 50 * time.Millisecond,
				Concurrencies: []int{1, 2}, Kinds: []string{kind}})
			if !slices.ContainsFunc(got, bad) {
				break
			}
			time.Sleep(time.Second) // let the other tests' connections go
		}
		for _, r := range got {
			seen[r.Name] = true
			if bad(r) {
				t.Errorf("row %s c=%d: %+v", r.Name, r.Concurrency, r)
			}
		}
		rows = append(rows, got...)
	}
	for _, name := range []string{"memory", "sqlite", "postgres", benchkit.RowPostgresClaim, "redis", benchkit.RowRedlock,
		benchkit.RefMutexMap, benchkit.RefSQLiteInsert, benchkit.RefPgxInsert, benchkit.RefPgbench,
		benchkit.RefGoRedis, benchkit.RefGoRedis5, benchkit.RefRedisBench} {
		if !seen[name] {
			t.Errorf("no row %q", name)
		}
	}

	rep := benchkit.Report{When: time.Now(), Host: "test", Rows: rows}
	// The claimers' scale scenarios side by side: 60 runs each, which
	// wait a second's lead for their instant; one after another they
	// took about 17s.
	scaleKinds := []string{"memory", "sqlite", "postgres", "redis", "redlock"}
	rep.Scale = make([]benchkit.Scale, len(scaleKinds))
	var wg sync.WaitGroup
	for i, kind := range scaleKinds {
		wg.Go(func() {
			var sc benchkit.Scale
			for try := 0; try < 3; try++ {
				sc = benchkit.RunScale(t.Context(), s, benchkit.ScaleOptions{Kind: kind, Jobs: 60, Replicas: 3,
					Lease: 1500 * time.Millisecond, Lead: time.Second, Timeout: 30 * time.Second})
				if sc.Error == "" {
					break
				}
				time.Sleep(time.Second)
			}
			sum := 0
			for _, n := range sc.Shares {
				sum += n
			}
			// A batch counts as one call, so batching claimers can go below 2.
			if sc.Error != "" || sc.Missing != 0 || sc.Duplicates != 0 || sum != 60 || sc.CallsPerRun <= 0 {
				t.Errorf("scale on %s: %+v", kind, sc)
			}
			rep.Scale[i] = sc
		})
	}
	wg.Wait()

	rep.Finish()
	for _, r := range rep.Rows {
		if r.Ref != "" && r.Error == "" && r.Ratio <= 0 && r.Ref != benchkit.RefRedisBench && r.Ref != benchkit.RefPgbench {
			t.Errorf("row %s c=%d has no ratio to %s", r.Name, r.Concurrency, r.Ref)
		}
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	for _, want := range []string{"redlock (5 nodes)", "targets", "scale", "max/min"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back benchkit.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Rows) != len(rows) || len(back.Scale) != 5 {
		t.Fatalf("JSON round trip: %v, %d rows", err, len(back.Rows))
	}
	var svg bytes.Buffer
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	if rects := svgElements(t, &svg)["rect"]; rects < len(rows)/2 {
		t.Errorf("SVG has %d bars for %d rows", rects-1, len(rows))
	}
	var curve bytes.Buffer
	if err := rep.WriteCurveSVG(&curve); err != nil {
		t.Fatal(err)
	}
	// One point and two lines (p99, p50) per scenario: here each claimer
	// ran one size on one fleet.
	if els := svgElements(t, &curve); els["circle"] != len(rep.Scale) || els["polyline"] != 2*len(rep.Scale) {
		t.Errorf("curve SVG has %d points and %d lines for %d scenarios", els["circle"], els["polyline"], len(rep.Scale))
	}
}

// svgElements checks that svg is well-formed XML and counts its elements
// by name.
func svgElements(t *testing.T, svg io.Reader) map[string]int {
	t.Helper()
	dec, els := xml.NewDecoder(svg), map[string]int{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return els
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			els[se.Name.Local]++
		}
	}
}

// TestCurvePlotsLagAgainstJobsOnLogScales: each claimer and fleet is one
// line through its sizes in order, and a larger lag sits higher (smaller
// y), a larger size further right.
func TestCurvePlotsLagAgainstJobsOnLogScales(t *testing.T) {
	rep := benchkit.Report{When: time.Now(), Host: "test"}
	for _, n := range []int{100_000, 1_000, 10_000} { // out of order on purpose
		rep.Scale = append(rep.Scale,
			benchkit.Scale{Claimer: "redis", Jobs: n, Replicas: 3, LagP50ms: float64(n) / 40, LagP99ms: float64(n) / 20},
			benchkit.Scale{Claimer: "redis", Jobs: n, Replicas: 5, Error: "unreachable"}) // no run started
	}
	var curve bytes.Buffer
	if err := rep.WriteCurveSVG(&curve); err != nil {
		t.Fatal(err)
	}
	out := curve.String()
	if els := svgElements(t, strings.NewReader(out)); els["circle"] != 3 || els["polyline"] != 2 {
		t.Fatalf("%d points and %d lines, want 3 and 2 (the failed fleet left out):\n%s", els["circle"], els["polyline"], out)
	}
	_, rest, _ := strings.Cut(out, `<polyline points="`)
	pts, _, _ := strings.Cut(rest, `"`)
	var xs, ys []float64
	for _, p := range strings.Fields(pts) {
		var x, y float64
		if _, err := fmt.Sscanf(p, "%f,%f", &x, &y); err != nil {
			t.Fatalf("point %q: %v", p, err)
		}
		xs, ys = append(xs, x), append(ys, y)
	}
	if len(xs) != 3 || !(xs[0] < xs[1] && xs[1] < xs[2]) || !(ys[0] > ys[1] && ys[1] > ys[2]) {
		t.Fatalf("p99 line %q: want sizes left to right and lag rising", pts)
	}
	if !strings.Contains(out, "redis × 3 replicas") || strings.Contains(out, "redis × 5 replicas") {
		t.Fatalf("legend wrong:\n%s", out)
	}
}

// TestMeasureReportsTheFirstError: a failing operation yields an error row,
// not numbers.
func TestMeasureReportsTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	r := benchkit.Measure(t.Context(), benchkit.Row{Name: "x"}, 2, 20*time.Millisecond,
		func(ctx context.Context, i int64) error {
			if i == 3 {
				return boom
			}
			return nil
		})
	if r.Error != "boom" || r.OpsPerSec != 0 {
		t.Fatalf("row = %+v, want error boom and no throughput", r)
	}
}

// TestTargetsJudgeEveryGoalOfTheIssue: the ratio targets are judged at
// their own concurrency, and the scale targets on the worst 10,000 × 3
// processes row of each claimer, where a duplicate or a missing run
// meets nothing and SQLite's fairness is printed without a bound.
func TestTargetsJudgeEveryGoalOfTheIssue(t *testing.T) {
	row := func(name string, c int, ops float64) benchkit.Row {
		return benchkit.Row{Name: name, Concurrency: c, OpsPerSec: ops, Ops: 1, P50us: 1, P99us: 1}
	}
	proc := func(claimer string, p99, fair float64) benchkit.Scale {
		return benchkit.Scale{Claimer: claimer, Jobs: 10_000, Replicas: 3, Processes: true, LagP99ms: p99, Fairness: fair, Shares: []int{1, 1, 1}}
	}
	rep := benchkit.Report{Rows: []benchkit.Row{
		row("redis", 1, 950), row(benchkit.RefGoRedis, 1, 1000), // 0.95: met
		row("redis", 16, 500), row(benchkit.RefGoRedis, 16, 1000), // 0.50: missed
		row(benchkit.RowPostgresClaim, 1, 899.6), row(benchkit.RefPgxInsert, 1, 1000), // 0.8996: printed so, not as 0.90
	}, Scale: []benchkit.Scale{
		proc("redis", 400, 1.2),
		proc("postgres", 450, 1.1),
		proc("postgres", 600, 1.1), // the worst of two runs decides
		proc("redlock", 900, 1.3),
		proc("sqlite", 800, 3),
		{Claimer: "etcd", Jobs: 60, Replicas: 3, Processes: true, LagP99ms: 1, Fairness: 1}, // smoke size: not judged
	}}
	dup := proc("redlock", 100, 1.0)
	dup.Duplicates = 1
	rep.Scale = append(rep.Scale, dup)
	rep.Finish()

	ratio := map[int]benchkit.Target{}
	for _, tg := range rep.Targets {
		if tg.Row == "redis" && tg.Of == benchkit.RefGoRedis {
			ratio[tg.Concurrency] = tg
		}
	}
	if tg := ratio[1]; !tg.Known || !tg.Met || tg.Got != 0.95 {
		t.Errorf("redis c=1: %+v, want 0.95 met", tg)
	}
	if tg := ratio[16]; !tg.Known || tg.Met || tg.Got != 0.5 {
		t.Errorf("redis c=16: %+v, want 0.50 missed", tg)
	}

	type key struct{ claimer, measure string }
	got := map[key]benchkit.ScaleTarget{}
	for _, st := range rep.ScaleTargets {
		got[key{st.Claimer, st.Measure}] = st
	}
	for _, c := range []struct {
		claimer, measure string
		known, met       bool
		value            float64
	}{
		{"redis", benchkit.ScaleLagP99, true, true, 400},
		{"postgres", benchkit.ScaleLagP99, true, false, 600},
		{"redlock", benchkit.ScaleLagP99, true, false, 900}, // under its 1s bound, but one run was duplicated
		{"sqlite", benchkit.ScaleLagP99, true, true, 800},
		{"redis", benchkit.ScaleFairness, true, true, 1.2},
		{"sqlite", benchkit.ScaleFairness, true, false, 3},
		{"etcd", benchkit.ScaleFairness, false, false, 0},
	} {
		st, ok := got[key{c.claimer, c.measure}]
		if !ok || st.Known != c.known || st.Met != c.met || st.Got != c.value {
			t.Errorf("%s %s: %+v, want known %v, met %v, got %v", c.claimer, c.measure, st, c.known, c.met, c.value)
		}
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	for _, want := range []string{"c=16", "scale targets", "MISSED", "no bound: its replicas share one file", "0.8996 ", "0.50 "} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}
