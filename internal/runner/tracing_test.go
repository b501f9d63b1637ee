package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/internal/tracing"
	"github.com/scheduler-dev/scheduler/job"
)

// traced is one replica with a tracer of its own (a process of its own:
// its own span ids), logging JSON through tracing.LogHandler.
type traced struct {
	rec    *tracetest.SpanRecorder
	logs   testenv.Logs
	cancel context.CancelFunc
	done   chan struct{}
	r      *runner.Runner
}

// records returns what logs logged with message msg.
func records(logs *testenv.Logs, msg string) []map[string]any {
	var out []map[string]any
	for _, m := range logs.JSONLines() {
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// newTraced builds a replica named name over store, with a recording
// tracer; tweak, when set, changes its options.
func newTraced(t *testing.T, name string, store *memory.Store, jobs []runner.Job, tweak func(*runner.Options)) *traced {
	t.Helper()
	x := &traced{rec: tracetest.NewSpanRecorder()}
	opts := runner.Options{
		Claimer: memory.New(store, name), ClaimerName: "memory", Instance: name, Lease: 3 * time.Second, MaxClockSkew: time.Second,
		Logger: slog.New(tracing.LogHandler(slog.NewJSONHandler(&x.logs, nil))),
		Tracer: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(x.rec)).Tracer("runner"),
	}
	if tweak != nil {
		tweak(&opts)
	}
	r, err := runner.New(opts, jobs)
	if err != nil {
		t.Fatal(err)
	}
	x.r = r
	return x
}

func (x *traced) start() {
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel, x.done = cancel, make(chan struct{})
	go func() { defer close(x.done); _ = x.r.Run(ctx) }()
}

func (x *traced) stop() { x.cancel(); <-x.done }

// spans returns the ended spans named name.
func (x *traced) spans(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range x.rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestRunSpan: a run's span carries the run and how it ended, the
// handler's context carries it (a handler's span nests under it), the
// run's log lines carry its ids, and claim and release batches have
// spans of their own.
func TestRunSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		handlerSpan := make(chan trace.SpanContext, 1)
		var wg sync.WaitGroup
		wg.Add(2)
		jobs := []runner.Job{
			{Name: "ok", Schedule: mustSchedule(t, "@every 1h"), Grace: time.Second,
				Handler: func(ctx context.Context, run job.Run) error {
					handlerSpan <- trace.SpanContextFromContext(ctx)
					_, child := trace.SpanFromContext(ctx).TracerProvider().Tracer("handler").Start(ctx, "work")
					child.End()
					run.Logger.InfoContext(ctx, "working")
					return nil
				}},
			{Name: "bad", Schedule: mustSchedule(t, "@every 1h"), Grace: time.Second,
				Handler: func(ctx context.Context, run job.Run) error { return errors.New("boom") }},
		}
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour - 2*time.Second)))
		a := newTraced(t, "a", memory.NewStore(nil), jobs, func(o *runner.Options) {
			o.Observe = func(e runner.Event) {
				if e.Kind == runner.EventFinished {
					wg.Done()
				}
			}
		})
		a.start()
		wg.Wait()
		a.stop()
		at := time.Now().Truncate(time.Hour)

		runs := map[string]sdktrace.ReadOnlySpan{}
		for _, name := range []string{"ok", "bad"} {
			s := a.spans("run " + name)
			if len(s) != 1 {
				t.Fatalf("%d spans named run %s, want 1", len(s), name)
			}
			runs[name] = s[0]
		}
		ok := runs["ok"]
		got := attrs(ok)
		for k, want := range map[attribute.Key]any{
			"scheduler.run_id": claim.Run{Job: "ok", At: at}.ID(), "scheduler.job": "ok",
			"scheduler.scheduled_at": at.UTC().Format(time.RFC3339Nano), "scheduler.attempt": int64(1),
			"scheduler.claimer": "memory", "scheduler.instance": "a", "scheduler.status": "succeeded",
		} {
			if v := got[k].AsInterface(); v != want {
				t.Errorf("run span %s = %v, want %v", k, v, want)
			}
		}
		if got["scheduler.fence"].AsInt64() <= 0 {
			t.Errorf("run span fence = %v, want > 0", got["scheduler.fence"])
		}
		if ok.Status().Code != codes.Ok {
			t.Errorf("run span status %+v, want ok", ok.Status())
		}
		if !ok.Parent().IsRemote() || ok.Parent().TraceID() != ok.SpanContext().TraceID() {
			t.Errorf("run span parent %+v, want the run's remote placeholder", ok.Parent())
		}
		if ok.SpanContext().TraceID() == runs["bad"].SpanContext().TraceID() {
			t.Error("two runs share a trace")
		}
		bad := runs["bad"]
		if bad.Status().Code != codes.Error || !strings.Contains(bad.Status().Description, "boom") ||
			attrs(bad)["scheduler.status"].AsString() != "failed" {
			t.Errorf("failed run span status %+v, attrs %v; want an error with the handler's", bad.Status(), attrs(bad))
		}
		if sc := <-handlerSpan; !sc.Equal(ok.SpanContext()) {
			t.Errorf("handler's span %v, want the run's %v", sc, ok.SpanContext())
		}
		work := a.spans("work")
		if len(work) != 1 || work[0].Parent().SpanID() != ok.SpanContext().SpanID() ||
			work[0].SpanContext().TraceID() != ok.SpanContext().TraceID() {
			t.Fatalf("handler spans %v, want one child of the run span", work)
		}

		// The run's log lines, the runner's and the handler's, carry its ids.
		for _, msg := range []string{"run started", "working", "run finished"} {
			var found bool
			for _, rec := range records(&a.logs, msg) {
				if rec["job"] != "ok" {
					continue
				}
				found = true
				if rec["trace_id"] != ok.SpanContext().TraceID().String() || rec["span_id"] != ok.SpanContext().SpanID().String() {
					t.Errorf("%q logged with trace_id %v span_id %v, want the run span's", msg, rec["trace_id"], rec["span_id"])
				}
			}
			if !found {
				t.Errorf("no %q logged for job ok", msg)
			}
		}

		var won int64
		for _, s := range a.spans("claim batch") {
			if a := attrs(s); a["scheduler.claimer"].AsString() != "memory" || a["scheduler.batch.size"].AsInt64() < 1 {
				t.Errorf("claim batch attrs %v", a)
			}
			won += attrs(s)["scheduler.batch.won"].AsInt64()
		}
		if won != 2 {
			t.Errorf("claim batches won %d runs, want 2", won)
		}
		linked := map[trace.SpanID]bool{}
		for _, s := range a.spans("release batch") {
			if s.Parent().IsValid() {
				t.Errorf("release batch has parent %v, want a root", s.Parent())
			}
			for _, l := range s.Links() {
				linked[l.SpanContext.SpanID()] = true
			}
		}
		if !linked[ok.SpanContext().SpanID()] || !linked[bad.SpanContext().SpanID()] {
			t.Errorf("release batches link %v, want both runs", linked)
		}
	})
}

// TestNoTracerNoTrace: without a tracer, or with a no-op one, a handler's
// context has no span and the run's log lines no trace ids.
func TestNoTracerNoTrace(t *testing.T) {
	for name, tr := range map[string]trace.Tracer{"nil": nil, "noop": noop.NewTracerProvider().Tracer("")} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				valid := make(chan bool, 1)
				jobs := []runner.Job{{Name: "ok", Schedule: mustSchedule(t, "@every 1h"),
					Handler: func(ctx context.Context, run job.Run) error {
						valid <- trace.SpanContextFromContext(ctx).IsValid()
						return nil
					}}}
				a := newTraced(t, "a", memory.NewStore(nil), jobs, func(o *runner.Options) { o.Tracer = tr })
				if st, err := a.r.Trigger(context.Background(), "ok", runner.TriggerOptions{}); err != nil || st != claim.Succeeded {
					t.Fatalf("trigger: %v, %v", st, err)
				}
				if <-valid {
					t.Error("the handler's context has a span")
				}
				for _, msg := range []string{"run started", "run finished"} {
					recs := records(&a.logs, msg)
					if len(recs) != 1 || recs[0]["trace_id"] != nil {
						t.Errorf("%q logged %v, want once without trace_id", msg, recs)
					}
				}
			})
		})
	}
}

// TestTraceAcrossTakeover: a run whose holder is cut off from the backend
// (a crash, as far as the others can tell) is taken over by a standby at
// attempt 2; each attempt has its span, on its replica, in one trace.
func TestTraceAcrossTakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore(nil)
		var fa *failing
		began, done := make(chan struct{}), make(chan struct{})
		jobs := []runner.Job{{Name: "billing", Schedule: mustSchedule(t, "@every 1h"), Overlap: runner.OverlapAllow,
			Handler: func(ctx context.Context, run job.Run) error {
				if run.Attempt == 1 {
					fa.down.Store(true) // a's backend is gone: no renewal, no release
					close(began)
					<-ctx.Done()
					return ctx.Err()
				}
				close(done)
				return nil
			}}}
		time.Sleep(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour - 2*time.Second)))
		a := newTraced(t, "a", store, jobs, func(o *runner.Options) {
			fa = &failing{Claimer: o.Claimer}
			o.Claimer = fa
		})
		a.start()
		<-began
		b := newTraced(t, "b", store, jobs, nil)
		b.start()
		<-done
		synctest.Wait()
		a.stop() // its release gives up a lease later
		b.stop()

		// The run taken over (a also records the instant before it missed).
		id := claim.Run{Job: "billing", At: time.Now().Truncate(time.Hour)}.ID()
		var spans []sdktrace.ReadOnlySpan
		for _, x := range []*traced{a, b} {
			var s []sdktrace.ReadOnlySpan
			for _, sp := range x.spans("run billing") {
				if attrs(sp)["scheduler.run_id"].AsString() == id {
					s = append(s, sp)
				}
			}
			if len(s) != 1 {
				t.Fatalf("%d spans of run %s on one replica, want 1", len(s), id)
			}
			spans = append(spans, s[0])
		}
		first, second := attrs(spans[0]), attrs(spans[1])
		if first["scheduler.attempt"].AsInt64() != 1 || first["scheduler.instance"].AsString() != "a" ||
			second["scheduler.attempt"].AsInt64() != 2 || second["scheduler.instance"].AsString() != "b" {
			t.Fatalf("run spans %v then %v, want attempt 1 on a, attempt 2 on b", first, second)
		}
		if spans[0].SpanContext().TraceID() != spans[1].SpanContext().TraceID() {
			t.Errorf("attempts in traces %s and %s, want one", spans[0].SpanContext().TraceID(), spans[1].SpanContext().TraceID())
		}
		if !spans[0].Parent().Equal(spans[1].Parent()) {
			t.Errorf("attempts under parents %v and %v, want the run's one", spans[0].Parent(), spans[1].Parent())
		}
		if spans[0].Status().Code != codes.Error || first["scheduler.status"].AsString() != string(claim.LeaseLost) {
			t.Errorf("attempt 1 status %+v, %v; want an error, lease_lost", spans[0].Status(), first["scheduler.status"])
		}
		if spans[1].Status().Code != codes.Ok || second["scheduler.status"].AsString() != string(claim.Succeeded) {
			t.Errorf("attempt 2 status %+v, %v; want ok, succeeded", spans[1].Status(), second["scheduler.status"])
		}
	})
}
