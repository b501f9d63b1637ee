package billing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scheduler-dev/scheduler/job"
)

// JobName is the shipped job's name.
const JobName = "billing.nightly"

const dateLayout = "2006-01-02"

// Period is a billing period, [Start, End), in UTC.
type Period struct{ Start, End time.Time }

// Day is the UTC calendar day containing t.
func Day(t time.Time) Period {
	y, m, d := t.UTC().Date()
	start := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	return Period{Start: start, End: start.AddDate(0, 0, 1)}
}

// PeriodFor is the period a run scheduled at t bills: the UTC calendar day
// before the one containing t. Every replica derives it from the run's
// instant, never from its own clock, so all attempts of a run bill the same
// period.
func PeriodFor(t time.Time) Period { return Day(Day(t).Start.AddDate(0, 0, -1)) }

// String renders a one-day period as its date, any other as start/end.
func (p Period) String() string {
	if p == Day(p.Start) {
		return p.Start.Format(dateLayout)
	}
	return p.Start.Format(time.RFC3339) + "/" + p.End.Format(time.RFC3339)
}

// Params are billing.nightly's params. Register the job with
// job.WithParams[Params]() so that commands check them before running.
type Params struct {
	// Period, a date (2026-01-31: that UTC day), bills another day than the
	// one before the run's instant.
	Period time.Time `yaml:"period"`
	// Pace slows each customer down, as a slow pricing or payment call
	// would; drills use it to pause a holder mid-run. Default 0.
	Pace time.Duration `yaml:"pace"`
}

// Validate rejects a period that is not a whole UTC day and a negative pace.
func (p Params) Validate() error {
	var errs []error
	if !p.Period.IsZero() && !p.Period.Equal(Day(p.Period).Start) {
		errs = append(errs, &job.ParamError{Key: "period", Value: p.Period.Format(time.RFC3339),
			Msg: "want a date such as 2026-01-31"})
	}
	if p.Pace < 0 {
		errs = append(errs, &job.ParamError{Key: "pace", Value: p.Pace.String(), Msg: "must not be negative"})
	}
	return errors.Join(errs...)
}

// period is the period a run bills: p.Period's day, or the one PeriodFor
// derives from the run's instant.
func (p Params) period(at time.Time) Period {
	if p.Period.IsZero() {
		return PeriodFor(at)
	}
	return Day(p.Period)
}

// Opener opens billing.nightly for a command that executes it: the Store on
// res.Database, migrated, and Handler over it; close closes the store. With
// res.Metrics set, rejected writes are counted there in
// scheduler_fence_rejections_total{resource="invoices"}. Register it with
// job.Registry.RegisterOpener under JobName, with job.WithParams[Params]().
func Opener(ctx context.Context, res job.Resources) (job.Handler, func() error, error) {
	var onReject func(string)
	if res.Metrics != nil {
		rejections, err := registerRejections(res.Metrics)
		if err != nil {
			return nil, nil, err
		}
		rejections.WithLabelValues(Resource) // exported as 0 until the first rejection
		onReject = func(resource string) { rejections.WithLabelValues(resource).Inc() }
	}
	s, err := Open(ctx, Options{Database: res.Database, OnReject: onReject})
	if err != nil {
		return nil, nil, err
	}
	return Handler(s), s.Close, nil
}

// registerRejections registers scheduler_fence_rejections_total in reg, or
// returns the one registered there already.
func registerRejections(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scheduler_fence_rejections_total",
		Help: "Fenced writes rejected because a holder with a higher fence had written the resource.",
	}, []string{"resource"})
	err := reg.Register(c)
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		if old, ok := dup.ExistingCollector.(*prometheus.CounterVec); ok {
			return old, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("billing: metrics: %w", err)
	}
	return c, nil
}

// Handler returns the billing.nightly handler over s. For each customer, in
// order, it writes the period's invoice under the run's fence. It stops at
// once when ctx is done (returning its cause) and when a write is rejected:
// a holder with a higher fence (a takeover of this run, or a later run of
// the same period) has written that invoice, so this holder is stale and
// returns an error wrapping job.ErrLeaseLost.
//
// Its params are Params: `period` (a date) bills another day than the one
// before the run's instant, `pace` slows it down.
func Handler(s *Store) job.Handler {
	return job.Typed(func(ctx context.Context, run job.Run, params Params) (err error) {
		log := cmp.Or(run.Logger, slog.New(slog.DiscardHandler))
		p := params.period(run.ScheduledAt)
		invoices, err := s.Charges(ctx, p)
		if err != nil {
			return cmp.Or(context.Cause(ctx), err)
		}
		pace := params.Pace
		written, rejected := 0, 0
		defer func() {
			level := slog.LevelInfo
			if err != nil {
				level = slog.LevelWarn
			}
			log.Log(ctx, level, "billing summary", "period", p.String(), "customers", len(invoices),
				"written", written, "rejected", rejected)
		}()
		for _, inv := range invoices {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if s.beforeWrite != nil {
				s.beforeWrite(run, written)
			}
			if pace > 0 {
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-time.After(pace):
				}
			}
			inv.WrittenBy = run.Instance
			ok, err := s.WriteInvoice(ctx, inv, run.Fence)
			if err != nil {
				return cmp.Or(context.Cause(ctx), err)
			}
			if !ok {
				rejected++
				return fmt.Errorf("billing: invoice of customer %d for %s: fence %d rejected, a newer holder wrote it: %w",
					inv.CustomerID, p, run.Fence, job.ErrLeaseLost)
			}
			written++
		}
		return nil
	})
}
