package cli

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scheduler-dev/scheduler/internal/billing"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/job"
)

// billingJob is billing.nightly as Main registers it. Config validation needs
// the name registered before any config is read, but the handler needs the
// configured database, and only commands that execute an enabled
// billing.nightly should open it: so the registered handler delegates to one
// bound later by openBilling.
type billingJob struct {
	h atomic.Pointer[job.Handler]
}

func (b *billingJob) handle(ctx context.Context, run job.Run) error {
	h := b.h.Load()
	if h == nil {
		return errors.New("billing: no database opened for " + billing.JobName)
	}
	return (*h)(ctx, run)
}

// registerBilling registers billing.nightly, unbound, in reg.
func registerBilling(reg *job.Registry) (*billingJob, error) {
	b := &billingJob{}
	if err := reg.Register(billing.JobName, b.handle); err != nil {
		return nil, err
	}
	return b, nil
}

// openBilling opens the configured database and binds billing.nightly to it
// when cfg enables that job; otherwise it opens nothing. With prom set, it
// registers scheduler_fence_rejections_total there. cleanup closes the store.
func (e *env) openBilling(ctx context.Context, cfg *config.Config, prom prometheus.Registerer) (cleanup func(), err error) {
	if j, ok := cfg.Jobs[billing.JobName]; !ok || !j.Enabled {
		return func() {}, nil
	}
	var onReject func(string)
	if prom != nil {
		rejections := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_fence_rejections_total",
			Help: "Fenced writes rejected because a holder with a higher fence had written the resource.",
		}, []string{"resource"})
		if err := prom.Register(rejections); err != nil {
			return nil, err
		}
		rejections.WithLabelValues(billing.Resource) // exported as 0 until the first rejection
		onReject = func(resource string) { rejections.WithLabelValues(resource).Inc() }
	}
	s, err := openBillingStore(ctx, cfg, onReject)
	if err != nil {
		return nil, err
	}
	h := billing.Handler(s)
	e.billing.h.Store(&h)
	return func() { e.billing.h.Store(nil); _ = s.Close() }, nil
}

// openBillingStore opens the billing store on cfg.Database, migrating it.
func openBillingStore(ctx context.Context, cfg *config.Config, onReject func(string)) (*billing.Store, error) {
	// Connecting and migrating a healthy database takes well under this.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d := cfg.Database
	o := billing.Options{Kind: d.Kind, DSN: d.DSN, Password: string(d.Password), OnReject: onReject}
	if d.Kind == config.DatabaseSQLite {
		o.DSN = d.Path
	}
	return billing.Open(ctx, o)
}

// seed creates demo customers and their usage for the last days UTC days up
// to today, so that billing.nightly, or `scheduler trigger billing.nightly`
// (which bills yesterday), has something to invoice.
func (e *env) seed(args []string) int {
	fs, path := e.flags("seed", "[--config FILE] [--customers N] [--days N]")
	customers := fs.Int("customers", 100, "create `N` demo customers")
	days := fs.Int("days", 7, "usage for the last `N` days, today included (UTC)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "scheduler seed: unexpected argument %q\n", fs.Arg(0))
		return ExitUsage
	}
	if *customers < 1 || *days < 1 {
		fmt.Fprintln(e.stderr, "scheduler seed: --customers and --days must be at least 1")
		return ExitUsage
	}
	cfg, ok := e.load(*path)
	if !ok {
		return ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s, err := openBillingStore(ctx, cfg, nil)
	if err != nil {
		return e.fail("%v", err)
	}
	defer s.Close()
	today := billing.Day(time.Now())
	periods := make([]billing.Period, *days)
	for i := range periods {
		periods[i] = billing.Day(today.Start.AddDate(0, 0, i-*days+1))
	}
	if err := s.Seed(ctx, *customers, periods...); err != nil {
		return e.fail("seed: %v", err)
	}
	where := cfg.Database.Path
	if cfg.Database.Kind == config.DatabasePostgres {
		where = config.Redact(cfg.Database.DSN)
	}
	fmt.Fprintf(e.stdout, "seeded %d customers with usage from %s to %s in %s %s\n",
		*customers, periods[0], periods[len(periods)-1], cfg.Database.Kind, where)
	return ExitOK
}
