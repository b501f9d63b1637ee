// This file owns the runner's traces (Options.Tracer): one span per run
// granted here, from the claim request that won it through its execution
// to its release, and one per claim batch and per release batch. With no
// tracer, none of it costs more than a nil check.

package runner

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Span attributes; the run's mirror its log keys (runAttrs).
const (
	attrJob         = attribute.Key("scheduler.job")
	attrRunID       = attribute.Key("scheduler.run_id")
	attrScheduledAt = attribute.Key("scheduler.scheduled_at")
	attrFence       = attribute.Key("scheduler.fence")
	attrAttempt     = attribute.Key("scheduler.attempt")
	attrClaimer     = attribute.Key("scheduler.claimer")
	attrInstance    = attribute.Key("scheduler.instance")
	attrStatus      = attribute.Key("scheduler.status") // how the run ended here, as "run finished" logs it
	attrReason      = attribute.Key("scheduler.reason") // why a won run was recorded missed
	attrBatchSize   = attribute.Key("scheduler.batch.size")
	attrBatchWon    = attribute.Key("scheduler.batch.won")
	attrBatchDone   = attribute.Key("scheduler.batch.released")
)

// noSpan is what the tracing helpers return without a tracer.
var noSpan = trace.SpanFromContext(context.Background())

// runParent is the span context every span of the run runID hangs from,
// on every replica and at every attempt: its trace id and span id are
// hashed from the run id, so the attempts of one run, on whichever
// replicas they ran (a takeover, a hand-back at shutdown), land in one
// trace without the replicas telling each other anything. It is passed
// as a remote parent: no span with its id is ever exported, so a trace
// viewer shows the attempts as the roots of the run's trace (some flag
// the missing parent). It is marked sampled, so parent-based samplers
// (the SDK's default) record every run; to sample runs, use a sampler
// that is not parent-based (OTEL_TRACES_SAMPLER=traceidratio), which
// decides on the trace id and so decides alike for every attempt. A rerun
// (backfill) has a run id of its own, hence a trace of its own.
func runParent(runID string) trace.SpanContext {
	sum := sha256.Sum256([]byte("scheduler run\x00" + runID))
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], sum[:16])
	copy(sid[:], sum[16:24])
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// startRun starts the span of run cl, granted here, and returns ctx and
// execCtx carrying it, so the handler's own spans nest under it and the
// run's log lines carry its ids. The span starts when the claim request
// that won the run was sent (cl.Requested, read before the keep-alive
// owns it) and ends with endRun once the run is released. A span the
// caller's context carried (a Trigger from a traced request) is linked.
func (r *Runner) startRun(ctx, execCtx context.Context, cl *claim.Claim) (context.Context, context.Context, trace.Span) {
	if r.opts.Tracer == nil {
		return ctx, execCtx, noSpan
	}
	opts := []trace.SpanStartOption{
		trace.WithTimestamp(cl.Requested),
		trace.WithAttributes(attrRunID.String(cl.ID()), attrJob.String(cl.Run.Job),
			attrScheduledAt.String(cl.Run.At.UTC().Format(time.RFC3339Nano)),
			attrFence.Int64(cl.Fence), attrAttempt.Int(cl.Attempt),
			attrClaimer.String(r.opts.ClaimerName), attrInstance.String(r.opts.Instance)),
	}
	if l := trace.LinkFromContext(execCtx); l.SpanContext.IsValid() {
		opts = append(opts, trace.WithLinks(l))
	}
	parent := runParent(cl.ID())
	_, span := r.opts.Tracer.Start(trace.ContextWithRemoteSpanContext(execCtx, parent), "run "+cl.Run.Job, opts...)
	if span.SpanContext().SpanID() == parent.SpanID() {
		// A no-op tracer hands the parent back: keep the placeholder out
		// of the contexts, or logs would carry a trace nobody records.
		return ctx, execCtx, noSpan
	}
	return trace.ContextWithSpan(ctx, span), trace.ContextWithSpan(execCtx, span), span
}

// endRun ends a run's span with how the run ended here: an error status
// for a run that failed, timed out or lost its lease, ok for a success,
// unset for a run interrupted, skipped or missed.
func endRun(span trace.Span, status claim.Status, err error) {
	if span.IsRecording() {
		span.SetAttributes(attrStatus.String(string(status)))
		switch status {
		case claim.Succeeded:
			span.SetStatus(codes.Ok, "")
		case claim.Failed, claim.Timeout, claim.LeaseLost:
			desc := string(status)
			if err != nil {
				span.RecordError(err)
				desc += ": " + err.Error()
			}
			span.SetStatus(codes.Error, desc)
		}
	}
	span.End()
}

// startBatch starts the span of a claim or release batch of size calls.
func (r *Runner) startBatch(ctx context.Context, name string, size int, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if r.opts.Tracer == nil {
		return ctx, noSpan
	}
	opts = append(opts, trace.WithAttributes(attrClaimer.String(r.opts.ClaimerName), attrBatchSize.Int(size)))
	return r.opts.Tracer.Start(ctx, name, opts...)
}

// endBatch ends a batch's span with how many of its calls the backend
// accepted (key), and an error status if some were not answered at all
// (an unavailable backend, a timeout) rather than refused.
func endBatch(span trace.Span, key attribute.Key, errs []error, refused ...error) {
	if span.IsRecording() {
		ok := 0
		var failed error
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case failed == nil && !isAny(err, refused):
				failed = err
			}
		}
		span.SetAttributes(key.Int(ok))
		if failed != nil {
			span.SetStatus(codes.Error, failed.Error())
		}
	}
	span.End()
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
