package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/runner"
	"github.com/scheduler-dev/scheduler/internal/schedule"
	"github.com/scheduler-dev/scheduler/internal/tracing"
	"github.com/scheduler-dev/scheduler/job"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clearEnv unsets, for the test, every variable Setup or the SDK reads.
func clearEnv(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
		"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"} {
		t.Setenv(k, "")
	}
}

func TestSetupFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		on   bool
		err  bool
	}{
		{name: "no endpoint", on: false},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, on: true},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, on: true},
		{name: "exporter otlp", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true},
		{name: "exporter none", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}},
		{name: "sdk disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true},
		{name: "http/json", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, on: true},
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, err: true},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer goleak.VerifyNone(t)
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			global := otel.GetTracerProvider()
			defer func() {
				if otel.GetTracerProvider() != global {
					otel.SetTracerProvider(global)
				}
			}()
			tp, shutdown, err := tracing.Setup(t.Context(), "scheduler", "r1")
			if tc.err {
				if err == nil {
					t.Fatal("Setup accepted the settings, want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Not ended: it is never exported, to a collector that is not there.
			_, span := tp.Tracer("t").Start(t.Context(), "x")
			recording := span.IsRecording()
			if _, sdk := tp.(*sdktrace.TracerProvider); sdk != tc.on || recording != tc.on {
				t.Errorf("provider %T, recording %v; want tracing on = %v", tp, recording, tc.on)
			}
			if !tc.on && otel.GetTracerProvider() != global {
				t.Error("tracing off, yet Setup replaced the global provider")
			}
			if err := shutdown(t.Context()); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		})
	}
}

// receiver is an OTLP/HTTP trace receiver.
type receiver struct {
	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a POST of protobuf to /v1/traces", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(r.Body)
	req := &coltracepb.ExportTraceServiceRequest{}
	if err == nil {
		err = proto.Unmarshal(body, req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.reqs = append(rc.reqs, req)
	rc.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// spans returns every span received, each with its resource's attributes.
func (rc *receiver) spans() (spans []*tracepb.Span, resources []map[string]string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, req := range rc.reqs {
		for _, rs := range req.GetResourceSpans() {
			res := kvs(rs.GetResource().GetAttributes())
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					spans = append(spans, s)
					resources = append(resources, res)
				}
			}
		}
	}
	return spans, resources
}

func kvs(attrs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range attrs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		default:
			m[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return m
}

// TestExportToOTLPReceiver: set up from the environment against a
// receiver, run a job once, shut down: the receiver has the run's span,
// with its attributes and the service's resource, and the handler's span
// (through the global provider) under it.
func TestExportToOTLPReceiver(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	clearEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
	defer otel.SetTracerProvider(otel.GetTracerProvider())

	tp, shutdown, err := tracing.Setup(t.Context(), "scheduler", "replica-1")
	if err != nil {
		t.Fatal(err)
	}
	sched, err := schedule.Parse("@every 1h", "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(runner.Options{Claimer: memory.New(memory.NewStore(nil), "replica-1"), ClaimerName: "memory",
		Instance: "replica-1", Tracer: tp.Tracer("runner")}, []runner.Job{{Name: "report", Schedule: sched,
		Handler: func(ctx context.Context, run job.Run) error {
			_, span := otel.Tracer("handler").Start(ctx, "work")
			span.End()
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := r.Trigger(t.Context(), "report", runner.TriggerOptions{}); err != nil || st != claim.Succeeded {
		t.Fatalf("trigger: %v, %v", st, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	spans, resources := rc.spans()
	byName := map[string]int{}
	for i, s := range spans {
		byName[s.GetName()] = i
	}
	i, ok := byName["run report"]
	if !ok {
		t.Fatalf("received spans %v, want run report", byName)
	}
	run, res := spans[i], resources[i]
	for k, want := range map[string]string{"service.name": "scheduler", "service.instance.id": "replica-1",
		"deployment.environment.name": "test"} {
		if res[k] != want {
			t.Errorf("resource %s = %q, want %q (%v)", k, res[k], want, res)
		}
	}
	got := kvs(run.GetAttributes())
	for k, want := range map[string]string{"scheduler.job": "report", "scheduler.claimer": "memory",
		"scheduler.instance": "replica-1", "scheduler.attempt": "1", "scheduler.status": "succeeded"} {
		if got[k] != want {
			t.Errorf("run span %s = %q, want %q (%v)", k, got[k], want, got)
		}
	}
	if !strings.HasPrefix(got["scheduler.run_id"], "report@") || got["scheduler.scheduled_at"] == "" || got["scheduler.fence"] == "" {
		t.Errorf("run span attributes %v, want run_id, scheduled_at, fence", got)
	}
	if run.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_OK {
		t.Errorf("run span status %v, want ok", run.GetStatus())
	}
	w, ok := byName["work"]
	if !ok || !bytes.Equal(spans[w].GetParentSpanId(), run.GetSpanId()) || !bytes.Equal(spans[w].GetTraceId(), run.GetTraceId()) {
		t.Errorf("handler span missing or not under the run span: %v", spans)
	}
	if _, ok := byName["claim batch"]; !ok {
		t.Errorf("received spans %v, want a claim batch", byName)
	}
}

func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil))).With("component", "test")
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "traced", "k", "v")
	log.InfoContext(context.Background(), "untraced")
	log.Info("no context")
	var lines []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("logged %d lines, want 3", len(lines))
	}
	if l := lines[0]; l["trace_id"] != sc.TraceID().String() || l["span_id"] != sc.SpanID().String() ||
		l["k"] != "v" || l["component"] != "test" {
		t.Errorf("traced record %v, want its attributes and the span's ids", l)
	}
	for _, l := range lines[1:] {
		if _, ok := l["trace_id"]; ok {
			t.Errorf("record %v has a trace_id, want none", l)
		}
		if _, ok := l["span_id"]; ok {
			t.Errorf("record %v has a span_id, want none", l)
		}
	}
}
