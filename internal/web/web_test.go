package web_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/web"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestProbesMetricsAndStatusPage(t *testing.T) {
	store := memory.NewStore(nil)
	c := memory.New(store, "replica-1")
	run := claim.Run{Job: "billing.nightly", At: time.Now().Truncate(time.Second)}
	if _, err := claim.ClaimOne(t.Context(), c, run, time.Minute); err != nil {
		t.Fatal(err)
	}
	var down, silent atomic.Bool
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "scheduler_test_total", Help: "t"}))
	srv := httptest.NewServer(web.Handler(web.Options{
		Instance: "replica-1", Claimer: "memory", History: c, Gatherer: reg,
		Ready: func(ctx context.Context) error {
			if silent.Load() { // a client still dialling again when the probe's time is up
				<-ctx.Done()
				return ctx.Err()
			}
			if down.Load() {
				return errors.New("backend unreachable")
			}
			return nil
		},
		Jobs: []web.JobInfo{{Name: "billing.nightly", Schedule: "@daily", Timezone: "UTC",
			Next: func(t time.Time) time.Time { return t.Truncate(24 * time.Hour).Add(24 * time.Hour) }}},
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()

	if code, body := get(t, srv, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	if code, _ := get(t, srv, "/readyz"); code != 200 {
		t.Fatalf("/readyz = %d, want 200", code)
	}
	down.Store(true)
	if code, body := get(t, srv, "/readyz"); code != 503 || !strings.Contains(body, "backend unreachable") {
		t.Fatalf("/readyz with the backend down = %d %q, want 503 naming why", code, body)
	}
	silent.Store(true)
	if code, body := get(t, srv, "/readyz"); code != 503 || !strings.Contains(body, "backend unavailable: no answer within 2s") {
		t.Fatalf("/readyz with a backend that does not answer = %d %q, want 503 saying so", code, body)
	}
	silent.Store(false)
	if code, body := get(t, srv, "/metrics"); code != 200 || !strings.Contains(body, "scheduler_test_total") {
		t.Fatalf("/metrics = %d %q", code, body)
	}
	code, body := get(t, srv, "/")
	if code != 200 {
		t.Fatalf("/ = %d", code)
	}
	for _, want := range []string{"replica-1", "billing.nightly", "@daily", "running"} {
		if !strings.Contains(body, want) {
			t.Fatalf("status page lacks %q:\n%s", want, body)
		}
	}
	if code, _ := get(t, srv, "/nope"); code != http.StatusNotFound {
		t.Fatalf("/nope = %d, want 404", code)
	}
}

// A manual run's instant (its request's time) is shown to the nanosecond
// and marked, so that it never reads as the scheduled run of its second
// recorded twice (an outside review saw two rows "19:02:40Z", one
// succeeded and one failed).
func TestTheStatusPageTellsAManualRunFromTheScheduledRunOfItsSecond(t *testing.T) {
	store := memory.NewStore(nil)
	c := memory.New(store, "replica-1")
	sec := time.Now().UTC().Truncate(time.Second)
	manual := sec.Add(50892684 * time.Nanosecond)
	for _, at := range []time.Time{sec, manual} {
		if _, err := claim.ClaimOne(t.Context(), c, claim.Run{Job: "billing.nightly", At: at}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(web.Handler(web.Options{Instance: "replica-1", Claimer: "memory", History: c,
		Gatherer: prometheus.NewRegistry(), Ready: func(context.Context) error { return nil },
		Jobs: []web.JobInfo{{Name: "billing.nightly", Schedule: "@daily", Timezone: "UTC",
			Next: func(t time.Time) time.Time { return t.Truncate(24 * time.Hour).Add(24 * time.Hour) }}}}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	_, body := get(t, srv, "/")
	scheduled := "<td>billing.nightly</td><td>" + sec.Format("2006-01-02 15:04:05Z") + "</td>"
	requested := "<td>billing.nightly</td><td>" + manual.Format("2006-01-02 15:04:05.000000000Z") + ` <span class="manual">· manual</span></td>`
	if strings.Count(body, scheduled) != 1 || strings.Count(body, requested) != 1 {
		t.Fatalf("status page: want the scheduled run as %q once and the manual one as %q:\n%s", scheduled, requested, body)
	}
}
