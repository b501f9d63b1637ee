package explore

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// Under the race detector the package's in-process sweeps run on one P
// (oneProc), so each of them keeps one core busy and leaves the other to
// whatever else runs then. They hold the machine-wide test lock shared
// (testenv.CPUHeavy), which keeps every wall-clock test of the suite
// waiting meanwhile: in CI about 200 s, one core idle for most of it.
// So TestMain runs twinTests in a second process of the same test
// binary (the twin), beside the package's other sweeps: two processes,
// one P each, both cores busy, and the lock held shared half as long.
//
// Only a run of every test splits (go test ./..., no -run, -skip, -list,
// -bench or -fuzz, not under -json): a run that names its tests runs
// them here. The twin is started by the first sweep that begins here
// (heavy), so that both processes hold the lock at once; the package's
// wall-clock test (TestNemesisOnRealBackends) runs before any sweep and
// needs it alone. Its output is printed after this process's, and its
// failure fails the package.

// twinTests are the sweeps the twin runs: about half the package's
// sweep time under the race detector (CI, stop 68: 127 s of 252 s; the
// rest is mostly TestExplore's 100 s).
var twinTests = []string{
	"TestTheSweepFindsPlantedBugs",
	"TestTheJudgeExcusesRestartsOnlyWhereTheyLoseWrites",
	"TestReplaceBesideALateTakeover",
	"TestABackfillOutwaitsItsOwnGrantFromAStalledServer",
	"TestATakeoverBuriedBehindEndedRunsIsStillSeen",
}

// twinEnv marks the twin's environment.
const twinEnv = "SCHEDULER_EXPLORE_TWIN"

var twin struct {
	planned bool // this process runs the others; the twin runs twinTests
	once    sync.Once
	cmd     *exec.Cmd
	out     bytes.Buffer
	err     error
}

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(twinEnv) != "" {
		go orphaned(os.Getppid())
	}
	planTwin()
	code := m.Run()
	if c := waitTwin(); code == 0 {
		code = c
	}
	os.Exit(code)
}

// orphaned ends the twin once its parent has died (killed by go test's
// timeout, or by hand): it would otherwise run on, holding the
// machine-wide test lock that the next test binaries wait for.
func orphaned(parent int) {
	for range time.Tick(time.Second) {
		if os.Getppid() != parent {
			fmt.Fprintln(os.Stderr, "the twin's parent process is gone: exiting")
			os.Exit(1)
		}
	}
}

// planTwin decides whether this run splits, and if so leaves twinTests
// to the twin.
func planTwin() {
	if !raceEnabled || os.Getenv(twinEnv) != "" {
		return
	}
	for _, name := range []string{"test.run", "test.skip", "test.list", "test.bench", "test.fuzz"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return
		}
	}
	if f := flag.Lookup("test.v"); f != nil && f.Value.String() == "test2json" {
		return
	}
	if err := flag.Set("test.skip", twinPattern()); err != nil {
		return
	}
	twin.planned = true
}

func twinPattern() string { return "^(" + strings.Join(twinTests, "|") + ")$" }

// heavy marks t as one of the package's in-process sweeps: it holds the
// machine shared (testenv.CPUHeavy), on one P under the race detector
// (oneProc), and starts the twin if this run splits.
func heavy(t *testing.T) {
	t.Helper()
	testenv.CPUHeavy(t)
	oneProc(t)
	startTwin()
}

// startTwin starts the twin, once, if this run splits.
func startTwin() {
	if !twin.planned {
		return
	}
	twin.once.Do(func() {
		var args []string
		for _, a := range os.Args[1:] {
			if !strings.HasPrefix(a, "-test.skip") && !strings.HasPrefix(a, "-test.run") {
				args = append(args, a)
			}
		}
		twin.cmd = exec.Command(os.Args[0], append(args, "-test.run="+twinPattern())...)
		twin.cmd.Env = append(os.Environ(), twinEnv+"=1")
		twin.cmd.Stdout, twin.cmd.Stderr = &twin.out, &twin.out
		if twin.err = twin.cmd.Start(); twin.err != nil {
			twin.cmd = nil
		}
	})
}

// waitTwin waits for the twin (starting it now if no sweep did), prints
// its output, and returns its exit code: 1 if it could not run.
func waitTwin() int {
	if !twin.planned {
		return 0
	}
	startTwin()
	if twin.cmd != nil {
		twin.err = twin.cmd.Wait()
	}
	fmt.Printf("=== the twin process (%s):\n%s", twinPattern(), twin.out.String())
	if twin.err != nil {
		fmt.Printf("--- FAIL: the twin process: %v\n", twin.err)
		return 1
	}
	return 0
}
