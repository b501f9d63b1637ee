package compare_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/cli"
	"github.com/scheduler-dev/scheduler/internal/compare"
	"github.com/scheduler-dev/scheduler/internal/history"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// result is one `scheduler compare` invocation through cli.Main.
type result struct {
	code        int
	stdout      string
	stderr      string
	report      compare.Report
	json, html  string
	reportError error
}

func compareCLI(t *testing.T, dir, name string, args ...string) result {
	r := result{json: filepath.Join(dir, name+".json"), html: filepath.Join(dir, name+".html")}
	var out, errOut bytes.Buffer
	r.code = cli.Main(append(append([]string{"compare"}, args...), "--json", r.json, "--html", r.html), nil, &out, &errOut)
	r.stdout, r.stderr = out.String(), errOut.String()
	data, err := os.ReadFile(r.json)
	if err == nil {
		err = json.Unmarshal(data, &r.report)
	}
	r.reportError = err
	return r
}

// TestGameDay runs the harness the way CI would gate on it: every real
// claimer under a paused holder and a crashed holder (10 cells); then the
// deliberately broken claimer, which must be caught, beside the backend
// restarts on private servers. The cells of one invocation sleep on wall
// time, so they run at once; the two waves keep the private servers'
// start-up (initdb) off the real cells' CPU: about 45s in all.
func TestGameDay(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock test: about 45s")
	}
	testenv.WallClock(t)
	dsn, redisAddr := testenv.PostgresDSN(t), testenv.RedisAddr(t)
	// SQLite files on tmpfs: a 1.5s lease cannot ride out the shared
	// disk's fsync stalls while other packages' tests write (FastDir).
	common := []string{"--replicas", "3", "--jobs", "5", "--duration", "16s", "--lease", "1500ms",
		"--max-clock-skew", "500ms", "--seed", "42", "--parallel", "0", "--temp-dir", testenv.FastDir(t)}
	real := append([]string{"--claimers", "memory,sqlite,postgres,redis,redlock", "--faults", "pause,crash",
		"--postgres-dsn", dsn, "--redis-addr", redisAddr}, common...)
	if addrs := os.Getenv(testenv.EnvRedlockAddrs); addrs != "" {
		real = append(real, "--redlock-addrs", addrs)
	} else if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Missing(t, "redis-server", "not on PATH: redlock cells start private nodes")
	}
	// Backend restarts on servers compare starts itself: a private
	// PostgreSQL cluster, a private redis-server for redis and per
	// redlock node.
	restartArgs := append([]string{"--claimers", "postgres,redis,redlock", "--faults", "postgres-restart,redis-restart"}, common...)
	if _, err := exec.LookPath("initdb"); err != nil {
		if out, err := exec.Command("pg_config", "--bindir").Output(); err != nil {
			testenv.Missing(t, "initdb", "not on PATH and no pg_config: postgres-restart starts a private cluster")
		} else {
			restartArgs = append(restartArgs, "--postgres-bin", strings.TrimSpace(string(out)))
		}
	}
	dir := t.TempDir()
	var good, bad, restarts result
	var wg sync.WaitGroup
	good = compareCLI(t, dir, "real", real...)
	wg.Go(func() {
		bad = compareCLI(t, dir, "broken", append([]string{"--claimers", "broken", "--faults", "none,pause,random"}, common...)...)
	})
	wg.Go(func() { restarts = compareCLI(t, dir, "restarts", restartArgs...) })
	wg.Wait()

	t.Run("RealClaimersKeepEveryGuarantee", func(t *testing.T) {
		if good.reportError != nil {
			t.Fatalf("exit %d, no report (%v):\n%s\n%s", good.code, good.reportError, good.stdout, good.stderr)
		}
		t.Logf("report:\n%s", good.stdout)
		if good.code != cli.ExitOK || !good.report.OK {
			t.Errorf("exit %d, ok=%v, failures %v; want 0 and ok", good.code, good.report.OK, good.report.Failures)
		}
		if got := len(good.report.Cells); got != 10 {
			t.Fatalf("%d cells, want 10 (5 claimers × pause, crash)", got)
		}
		for _, c := range good.report.Cells {
			name := c.Claimer + " × " + c.Fault
			switch {
			case c.Status != compare.StatusOK:
				t.Errorf("%s: status %s (%s), want ok; notes %v; duplicates %v; violations:\n%s", name, c.Status, c.Reason, c.Notes, c.DuplicateDetails,
					strings.Join(c.Violations, "\n"))
				continue
			case c.RunsExpected == 0:
				t.Errorf("%s: no run in the steady window", name)
			case c.DuplicateExecutions != 0 || c.MissedRuns != 0 || c.StaleWritesAccepted != 0:
				t.Errorf("%s: %d duplicates %v, %d missed %v, %d stale writes accepted; want none",
					name, c.DuplicateExecutions, c.DuplicateDetails, c.MissedRuns, c.MissedRunIDs, c.StaleWritesAccepted)
			case len(c.Violations) != 0:
				t.Errorf("%s: history checker violations %v; want none", name, c.Violations)
			}
			switch c.Fault {
			case compare.FaultPause:
				// The paused holder woke after its successor had written:
				// its late writes must have met a higher fence, and its
				// context must have said why.
				if c.StaleWritesRejected == 0 || c.LeaseLostSeen == 0 {
					t.Errorf("%s: %d stale writes rejected, %d handlers saw ErrLeaseLost; want both > 0 (events %+v)",
						name, c.StaleWritesRejected, c.LeaseLostSeen, c.FaultEvents)
				}
			case compare.FaultCrash:
				if c.Takeovers == 0 || c.TakeoverTime.Count == 0 {
					t.Errorf("%s: no takeover after the crash (events %+v)", name, c.FaultEvents)
				}
			}
		}
	})

	t.Run("BackendRestarts", func(t *testing.T) {
		if restarts.reportError != nil {
			t.Fatalf("exit %d, no report (%v):\n%s\n%s", restarts.code, restarts.reportError, restarts.stdout, restarts.stderr)
		}
		t.Logf("report:\n%s", restarts.stdout)
		cells := map[string]*compare.Cell{}
		for _, c := range restarts.report.Cells {
			cells[c.Claimer+" × "+c.Fault] = c
		}
		for _, name := range []string{"postgres × redis-restart", "redis × postgres-restart", "redlock × postgres-restart"} {
			if c := cells[name]; c == nil || c.Status != compare.StatusSkipped {
				t.Errorf("%s: status %s, want skipped (the fault does not apply)", name, c.Status)
			}
		}
		for _, name := range []string{"postgres × postgres-restart", "redis × redis-restart", "redlock × redis-restart"} {
			c := cells[name]
			if c == nil {
				t.Fatalf("%s: no such cell", name)
			}
			if c.Status == compare.StatusSkipped || c.Status == compare.StatusError {
				t.Errorf("%s: status %s (%s), want it run", name, c.Status, c.Reason)
				continue
			}
			var restarted []compare.FaultEvent
			for _, f := range c.FaultEvents {
				if strings.HasSuffix(f.Kind, "-restart") {
					restarted = append(restarted, f)
				}
			}
			if len(restarted) != 1 || strings.Contains(restarted[0].Note, "restart failed") {
				t.Errorf("%s: restart events %+v, want one that succeeded", name, restarted)
			}
			if c.StaleWritesAccepted != 0 {
				t.Errorf("%s: %d stale writes accepted", name, c.StaleWritesAccepted)
			}
		}
		// The redis claimer noticed its server came back empty and told
		// the replicas (each then warns once); it may still re-run a run
		// that finished just before (docs/compare.md), so its status is
		// not asserted.
		if c := cells["redis × redis-restart"]; c.DataLossTold == 0 {
			t.Errorf("redis × redis-restart: no replica was told of the data loss; notes %v", c.Notes)
		}
		// PostgreSQL commits a claim before granting it: after a crash and
		// an outage as long as a lease, every guarantee holds. (A Redis
		// node restarted empty may lose a lock; docs/compare.md says when
		// that breaks redlock's quorum, and the report shows it.)
		if c := cells["postgres × postgres-restart"]; c.Status != compare.StatusOK || c.RunsExpected == 0 || c.DuplicateExecutions != 0 || c.MissedRuns != 0 {
			t.Errorf("postgres × postgres-restart: status %s, %d runs expected, %d duplicates %v, %d missed %v; want ok, some, none, none",
				c.Status, c.RunsExpected, c.DuplicateExecutions, c.DuplicateDetails, c.MissedRuns, c.MissedRunIDs)
		}
	})

	t.Run("BrokenClaimerIsCaught", func(t *testing.T) {
		if bad.reportError != nil {
			t.Fatalf("exit %d, no report (%v):\n%s\n%s", bad.code, bad.reportError, bad.stdout, bad.stderr)
		}
		if bad.code != cli.ExitRuntime || bad.report.OK {
			t.Errorf("exit %d, ok=%v; want 1 and not ok", bad.code, bad.report.OK)
		}
		for _, c := range bad.report.Cells {
			if c.DuplicateExecutions == 0 || c.Status != compare.StatusFailed {
				t.Errorf("broken × %s: status %s with %d duplicates; want failed with duplicates", c.Fault, c.Status, c.DuplicateExecutions)
			}
			// Scripted cells and random alike go through history.Check.
			if len(c.Violations) == 0 {
				t.Errorf("broken × %s: the history checker found no violation", c.Fault)
			}
		}
		if !strings.Contains(bad.stdout, "FAILED") || !strings.Contains(bad.stdout, "duplicate executions") {
			t.Errorf("terminal report does not say what failed:\n%s", bad.stdout)
		}
	})

	t.Run("HTMLReportRendersInChromium", func(t *testing.T) {
		browser := testenv.Chromium(t)
		page, err := os.ReadFile(good.html)
		if err != nil {
			t.Fatal(err)
		}
		for _, banned := range []string{"<script", "http://", "https://"} {
			if bytes.Contains(bytes.ReplaceAll(page, []byte(`xmlns="http://www.w3.org/2000/svg"`), nil), []byte(banned)) {
				t.Errorf("report is not self-contained: it contains %q", banned)
			}
		}
		url := "file://" + good.html
		dom := testenv.Headless(t, browser, "--dump-dom", url)
		for _, want := range []string{"<h1>scheduler compare</h1>", `aria-label="claim latency CDF"`, `aria-label="timeline"`, "redlock × crash"} {
			if !strings.Contains(dom, want) {
				t.Errorf("rendered report lacks %q", want)
			}
		}
		shot := filepath.Join(testenv.ArtifactDir(t), "compare-report.png")
		testenv.Headless(t, browser, "--window-size=1200,1800", "--screenshot="+shot, url)
		if st, err := os.Stat(shot); err != nil || st.Size() < 10000 {
			t.Fatalf("screenshot %s: %v", shot, err)
		}
		t.Logf("screenshot: %s", shot)
	})
}

// TestHistoryCheckerJudgesScriptedCells runs a correct claimer and the
// broken one side by side under the same scripted scenario: the history
// checker (internal/history), fed by the cells' own record, must flag the
// broken claimer and nothing of the correct one.
func TestHistoryCheckerJudgesScriptedCells(t *testing.T) {
	if testing.Short() {
		t.Skip("wall-clock test: about 10s")
	}
	testenv.WallClock(t)
	r := compareCLI(t, t.TempDir(), "history", "--claimers", "memory,broken", "--faults", "none",
		"--replicas", "3", "--jobs", "3", "--duration", "10s", "--lease", "1s", "--max-clock-skew", "500ms",
		"--seed", "7", "--parallel", "0")
	if r.reportError != nil {
		t.Fatalf("exit %d, no report (%v):\n%s\n%s", r.code, r.reportError, r.stdout, r.stderr)
	}
	if len(r.report.Cells) != 2 {
		t.Fatalf("%d cells, want 2", len(r.report.Cells))
	}
	for _, c := range r.report.Cells {
		switch c.Claimer {
		case "memory":
			if len(c.Violations) != 0 || c.Status != compare.StatusOK {
				t.Errorf("memory × none: status %s, violations %v; want ok and none", c.Status, c.Violations)
			}
		case "broken":
			invs := map[string]bool{}
			for _, v := range c.Violations {
				inv, _, _ := strings.Cut(v, " ")
				invs[inv] = true
			}
			for _, want := range []string{history.GrantOverlap, history.FenceOrder, history.SucceededTwice} {
				if !invs[want] {
					t.Errorf("broken × none: no %s among the checker's violations %v", want, invs)
				}
			}
			if c.Status != compare.StatusFailed || !strings.Contains(r.stdout, "violations of the history checker") {
				t.Errorf("broken × none: status %s; want failed, and the report saying why:\n%s", c.Status, r.stdout)
			}
		}
	}
}

func TestBadUsageExits2NamingTheFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--faults", "pause,meteor"}, `unknown fault "meteor"`},
		{[]string{"--faults", "skew+skew-beyond"}, "contradict"},
		{[]string{"--claimers", "memory,zookeeper"}, `unknown claimer "zookeeper"`},
		{[]string{"--claimers", "memory", "--replicas", "1"}, "--replicas 1"},
		{[]string{"--claimers", "memory", "--jobs", "2"}, "--jobs 2"},
		{[]string{"--claimers", "memory", "--duration", "5s"}, "--duration 5s"},
		{[]string{"--claimers", "memory", "--lease", "10ms"}, "--lease 10ms"},
		{[]string{"--claimers", "memory", "--temp-dir", "/no/such/dir"}, "--temp-dir /no/such/dir: no such file"},
		{[]string{"--claimers", "memory", "--temp-dir", file}, "--temp-dir " + file + ": not a directory"},
		{[]string{"--claimers", "memory", "extra"}, `unexpected argument "extra"`},
		// Every problem at once: a bad --faults no longer hides the others.
		{[]string{"--claimers", "zookeeper", "--faults", "meteor"}, `unknown claimer "zookeeper"`},
		{[]string{"--claimers", "zookeeper", "--faults", "meteor"}, `unknown fault "meteor"`},
	} {
		var out, errOut bytes.Buffer
		code := cli.Main(append([]string{"compare"}, tc.args...), nil, &out, &errOut)
		if code != cli.ExitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("compare %v: exit %d, want %d and an error saying %q; got:\n%s", tc.args, code, cli.ExitUsage, tc.want, errOut.String())
		}
	}
}

func TestParseScenarios(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: "pause,crash", want: []string{"pause", "crash"}},
		{in: " pause + skew , none ", want: []string{"pause+skew", "none"}},
		{in: "none+pause", bad: true},
		{in: "pause,pause", bad: true},
		{in: "crash+crash", bad: true},
		{in: "", bad: true},
		{in: "gc", bad: true},
		{in: "random, pause", want: []string{"random", "pause"}},
		{in: "random+pause", bad: true},
		{in: "random,random", bad: true},
	} {
		got, err := compare.ParseScenarios(tc.in)
		if (err != nil) != tc.bad || strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("ParseScenarios(%q) = %v, %v; want %v (error: %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}
