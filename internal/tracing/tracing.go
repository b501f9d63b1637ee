// Package tracing sets up OpenTelemetry traces from the standard OTEL_*
// environment variables, and ties log records to them.
//
// Tracing is off (a no-op provider: no exporter, no goroutine) unless an
// exporter is asked for: OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, or OTEL_TRACES_EXPORTER=otlp.
// OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true turns it off
// whatever else is set. When on, spans are batched (OTEL_BSP_*) to an OTLP
// exporter over OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf (the default), http/json or
// grpc. The exporter reads its own settings (endpoint, headers, timeout,
// compression, certificates: OTEL_EXPORTER_OTLP_*), the SDK its sampler
// (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG) and span limits, and
// the resource takes OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME over
// the service name and instance Setup is given.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Setup returns the process's tracer provider, configured by the OTEL_*
// environment variables (see the package doc), and a shutdown that
// flushes the spans still buffered and stops the exporter; call it before
// the process exits. serviceName and instance name the resource
// (service.name, service.instance.id) unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES say otherwise.
//
// When tracing is on, the provider also becomes the global one
// (otel.SetTracerProvider), with the W3C trace context and baggage
// propagators, so that a handler's own otel.Tracer spans are exported
// too, under its run's span. When it is off, Setup returns a no-op
// provider and touches no global.
func Setup(ctx context.Context, serviceName, instance string) (trace.TracerProvider, func(context.Context) error, error) {
	on, err := enabled()
	if err != nil || !on {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName), semconv.ServiceInstanceID(instance)),
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME, override the above
		resource.WithTelemetrySDK(),
		resource.WithHost())
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: resource: %w", err)
	}
	var exp sdktrace.SpanExporter
	switch p := protocol(); p {
	case "", "http/protobuf", "http/json":
		exp, err = otlptracehttp.New(ctx) // reads the protocol itself, for http/json
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		err = fmt.Errorf("protocol %q: want http/protobuf, http/json or grpc", p)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp, tp.Shutdown, nil
}

// enabled reports whether the environment asks for traces.
func enabled() (bool, error) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	exporters := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	if exporters == "" {
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	}
	on := false
	for e := range strings.SplitSeq(exporters, ",") {
		switch e = strings.TrimSpace(e); e {
		case "none":
			return false, nil
		case "otlp":
			on = true
		default:
			return false, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER=%q: only otlp and none are supported", e)
		}
	}
	return on, nil
}

// protocol is the OTLP protocol asked for, "" for the default.
func protocol() string {
	if p := strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")); p != "" {
		return p
	}
	return strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
}

// LogErrors sends the errors of the OpenTelemetry SDK (an export that
// failed: the collector is down or refuses the spans) to log at warn,
// instead of as plain text on stderr. The handler is process-wide.
func LogErrors(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing error", "component", "otel", "error", err.Error())
	}))
}

// LogHandler wraps h so that a record logged with a context that carries
// a valid span gets the span's ids, as trace_id and span_id; records
// logged without one are passed on unchanged. Log with the context
// (InfoContext, …) for the ids to appear. Under a WithGroup they land in
// the group, like any attribute added by Handle.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r = r.Clone()
			r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(attrs)}
}

func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }
