package main_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/testenv"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestStatusPageInABrowserAndProbes starts a replica with its HTTP server,
// lets a run finish, then loads the status page in headless Chromium and
// checks the probes and metrics. The DSN carries a password (ignored by the
// test server's trust auth) that must appear nowhere.
func TestStatusPageInABrowserAndProbes(t *testing.T) {
	testenv.WallClock(t)
	browser := testenv.Chromium(t)
	const secret = "Sup3rS3cretPw"
	dir := t.TempDir()
	addr := freeAddr(t)
	dsn := strings.Replace(pgSchema(t), "postgres://postgres@", "postgres://postgres:"+secret+"@", 1)
	config := writeConfig(t, dir, `instance_id: web-1
claimer:
  kind: postgres
  postgres:
    dsn: "`+dsn+`"
  lease: 3s
  max_clock_skew: 500ms
http:
  addr: "`+addr+`"
log:
  format: json
  level: debug
jobs:
  example.sleep:
    schedule: "* * * * * *"
    params:
      duration: 100ms
`)
	p := startReplica(t, dir, config, "web-1")
	base := "http://" + addr
	waitFor(t, "readiness", func() bool { code, _ := get(t, base+"/readyz"); return code == 200 })
	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	waitFor(t, "a finished run on the page", func() bool {
		_, body := get(t, base+"/")
		return strings.Contains(body, `class="succeeded">succeeded`)
	})

	dom := testenv.Headless(t, browser, "--dump-dom", base+"/")
	for _, want := range []string{`id="instance">web-1`, `id="claimer">postgres`, `<tr class="job"><td>example.sleep</td>`, `<tr class="run"><td>example.sleep</td>`} {
		if !strings.Contains(dom, want) {
			t.Fatalf("rendered page lacks %q:\n%s", want, dom)
		}
	}
	shot := filepath.Join(testenv.ArtifactDir(t), "status-page.png")
	testenv.Headless(t, browser, "--window-size=420,900", "--screenshot="+shot, base+"/")
	if st, err := os.Stat(shot); err != nil || st.Size() < 1000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}

	_, metrics := get(t, base+"/metrics")
	for _, want := range []string{`scheduler_claims_total{claimer="postgres",job="example.sleep",result="won"}`,
		`scheduler_runs_total{job="example.sleep",status="succeeded"}`, "go_goroutines", "process_resident_memory_bytes"} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
	logs, _ := os.ReadFile(filepath.Join(dir, "web-1.log"))
	for what, text := range map[string]string{"page": dom, "metrics": metrics, "logs": string(logs)} {
		if strings.Contains(text, secret) {
			t.Fatalf("password appears in %s", what)
		}
	}
}

// TestReadinessFollowsTheBackend stops a private redis-server under a
// running replica: /readyz turns 503 while it is down and 200 once it is
// back, without a restart of the replica.
func TestReadinessFollowsTheBackend(t *testing.T) {
	node := testenv.StartRedis(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	config := writeConfig(t, dir, `instance_id: ready-1
claimer:
  kind: redis
  redis:
    addr: `+node.Addr()+`
http:
  addr: "`+addr+`"
log:
  format: json
jobs:
  example.sleep:
    schedule: "* * * * * *"
`)
	startReplica(t, dir, config, "ready-1")
	url := "http://" + addr + "/readyz"
	waitFor(t, "ready", func() bool { code, _ := get(t, url); return code == 200 })
	node.Stop()
	waitFor(t, "not ready while redis is down", func() bool { code, _ := get(t, url); return code == 503 })
	_, body := get(t, url)
	if !strings.Contains(body, "unavailable") {
		t.Fatalf("/readyz body does not say why: %q", body)
	}
	node.Start()
	waitFor(t, "ready again", func() bool { code, _ := get(t, url); return code == 200 })
}

// A replica shutting down is not ready: a load balancer that follows
// /readyz stops sending operator calls it refuses ("this replica is
// shutting down") while its runs in flight drain. It said ready through
// the whole grace (an outside review). It stays alive (/healthz) and
// keeps serving its metrics meanwhile.
func TestAReplicaShuttingDownIsNotReady(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	p := replicaServingARunInFlight(t, dir, "drain-1", "1m", addr)
	if code, body := get(t, "http://"+addr+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the shutdown: %d %q, want 200", code, body)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, "the SIGTERM to be logged", func() bool { return shutdownLogged(t, dir, "drain-1", "terminated") })
	code, body := get(t, "http://"+addr+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz while the run in flight drains: %d %q, want 503 saying it is shutting down", code, body)
	}
	if code, _ := get(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while draining: %d, want 200", code)
	}
	if code, _ := get(t, "http://"+addr+"/metrics"); code != http.StatusOK {
		t.Errorf("/metrics while draining: %d, want 200", code)
	}
	select {
	case <-p.done:
		t.Fatal("the replica exited before the test could probe its drain")
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM) // the second: out now
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the second SIGTERM did not end the replica")
	}
}
