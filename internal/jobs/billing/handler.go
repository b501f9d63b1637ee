package billing

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

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

// period reads params.period ("2026-01-31": that UTC day) or derives the
// period from the run's instant.
func period(run job.Run) (Period, error) {
	switch v := run.Params["period"].(type) {
	case nil:
		return PeriodFor(run.ScheduledAt), nil
	case time.Time: // YAML may decode an unquoted date as a timestamp
		return Day(v), nil
	case string:
		t, err := time.Parse(dateLayout, v)
		if err != nil {
			return Period{}, fmt.Errorf("params.period: %q: want a date such as 2026-01-31", v)
		}
		return Day(t), nil
	default:
		return Period{}, fmt.Errorf("params.period: %v: want a date such as 2026-01-31", v)
	}
}

// Handler returns the billing.nightly handler over s. For each customer, in
// order, it writes the period's invoice under the run's fence. It stops at
// once when ctx is done (returning its cause) and when a write is rejected:
// a holder with a higher fence (a takeover of this run, or a later run of
// the same period) has written that invoice, so this holder is stale and
// returns an error wrapping job.ErrLeaseLost.
//
// The params may set `period` (a date) to bill another day than the one
// before the run's instant.
func Handler(s *Store) job.Handler {
	return func(ctx context.Context, run job.Run) (err error) {
		log := cmp.Or(run.Logger, slog.New(slog.DiscardHandler))
		p, err := period(run)
		if err != nil {
			return err
		}
		invoices, err := s.Charges(ctx, p)
		if err != nil {
			return cmp.Or(context.Cause(ctx), err)
		}
		// params.pace slows each customer down, as a slow pricing or payment
		// call would; drills use it to pause a holder mid-run.
		pace, err := run.Params.Duration("pace", 0)
		if err != nil {
			return err
		}
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
	}
}
