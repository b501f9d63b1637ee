// Package billing is the billing.nightly job that cmd/scheduler ships: for
// each customer it computes a period's charge from usage rows and writes one
// invoice per (customer, period), on PostgreSQL or SQLite, in the
// configuration's `database` block (see Opener).
//
// Invoices are idempotent and fenced. The primary key (customer_id,
// period_start) makes a second invoice for a period impossible, and every
// write is one upsert that only applies when its fence is at least the one
// already stored on that row: a holder that lost its lease cannot overwrite
// the invoice its successor wrote.
//
// The fence's high-water mark is kept per (customer, period), on the invoice
// row itself. A stale holder that wakes up and writes a customer its
// successor has not reached yet is therefore accepted. That is harmless: the
// amount is a pure function of the usage rows, so the stale holder writes the
// value the successor will write again, with its higher fence, a moment
// later. What fencing prevents is the harmful case, a stale write replacing
// newer work.
package billing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/job"
	"github.com/scheduler-dev/scheduler/migrations"
)

// Resource is the fenced resource's name in rejection callbacks and in the
// scheduler_fence_rejections_total{resource} metric.
const Resource = "invoices"

// Database kinds accepted by Open (config database.kind).
const (
	KindSQLite   = "sqlite"
	KindPostgres = "postgres"
)

// Queries are written once with $n placeholders and a {now} marker for the
// database clock; rebind adapts them to the dialect.
const (
	// upsertInvoice writes an invoice unless the row carries a higher fence.
	// A rejected write affects no row. Concurrent upserts of one row are
	// serialized by the database (row lock in PostgreSQL, the write lock in
	// SQLite), and the WHERE sees the row as the winner left it.
	upsertInvoice = `
INSERT INTO billing_invoices
       (customer_id, period_start, period_end, amount_cents, fence, written_by, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, {now}, {now})
ON CONFLICT (customer_id, period_start) DO UPDATE
   SET period_end = excluded.period_end, amount_cents = excluded.amount_cents,
       fence = excluded.fence, written_by = excluded.written_by, updated_at = excluded.updated_at
 WHERE billing_invoices.fence <= excluded.fence`

	// charges sums every customer's usage over [$1, $2), customers without
	// usage included (they get a zero invoice), in customer order.
	charges = `
SELECT c.id, c.rate_cents, CAST(COALESCE(SUM(u.units), 0) AS BIGINT)
  FROM billing_customers c
  LEFT JOIN billing_usage u ON u.customer_id = c.id AND u.at >= $1 AND u.at < $2
 GROUP BY c.id, c.rate_cents
 ORDER BY c.id`

	listInvoices = `
SELECT customer_id, period_start, period_end, amount_cents, fence, written_by, created_at, updated_at
  FROM billing_invoices
 WHERE period_start = $1
 ORDER BY customer_id`

	seedCustomer = `INSERT INTO billing_customers (id, name, rate_cents) VALUES ($1, $2, $3)
ON CONFLICT (id) DO NOTHING`

	seedUsage = `INSERT INTO billing_usage (customer_id, at, units) VALUES ($1, $2, $3)
ON CONFLICT (customer_id, at) DO NOTHING`
)

// Options configure Open.
type Options struct {
	// Database is where the store lives: Kind KindSQLite with Path, or
	// KindPostgres with DSN (and Password, which replaces the DSN's).
	Database job.Database
	// OnReject, when set, is called with Resource for every rejected write;
	// Opener counts scheduler_fence_rejections_total with it.
	OnReject func(resource string)
}

// Store holds customers, usage and invoices. It is safe for concurrent use.
type Store struct {
	db       *sql.DB
	dialect  migrations.Dialect
	onReject func(string)
	rejected atomic.Int64

	upsert, charges, invoices, customer, usage string

	// beforeWrite, when set (tests only), is called by the handler before
	// each invoice write with the number of invoices the run wrote so far.
	// Tests block in it to pause a holder mid-run.
	beforeWrite func(run job.Run, written int)
}

// Open connects to the database, applies pending migrations and returns the
// store. Errors never contain the password.
func Open(ctx context.Context, o Options) (*Store, error) {
	var db *sql.DB
	var d migrations.Dialect
	switch c := o.Database; c.Kind {
	case KindSQLite:
		if c.Path == "" {
			return nil, errors.New("billing: sqlite: empty path")
		}
		var err error
		if db, err = sql.Open("sqlite", migrations.SQLiteDSN(c.Path)); err != nil {
			return nil, fmt.Errorf("billing: sqlite %s: %w", c.Path, err)
		}
		d = migrations.SQLite
	case KindPostgres:
		cc, err := pgx.ParseConfig(c.DSN)
		if err != nil {
			return nil, fmt.Errorf("billing: postgres: %v", config.RedactError(err, c.DSN))
		}
		if c.Password != "" {
			cc.Password = c.Password
		}
		db = stdlib.OpenDB(*cc)
		d = migrations.Postgres
	default:
		return nil, fmt.Errorf("billing: database kind %q: want %s or %s", c.Kind, KindSQLite, KindPostgres)
	}
	// Not SQLite: its first connection switches a new file to WAL, which
	// another replica opening it may be doing too, and Up tries that
	// again where a ping would not.
	if d == migrations.Postgres {
		if err := db.PingContext(ctx); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("billing: %s: %w", d, err)
		}
	}
	if err := migrations.Up(ctx, db, d); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("billing: %w", err)
	}
	return newStore(db, d, o.OnReject), nil
}

func newStore(db *sql.DB, d migrations.Dialect, onReject func(string)) *Store {
	now := "now()"
	r := strings.NewReplacer("{now}", now)
	if d == migrations.SQLite {
		// SQLite's clock in unix milliseconds; ?n is SQLite's numbered
		// parameter, the same as PostgreSQL's $n.
		r = strings.NewReplacer("{now}", "CAST(unixepoch('subsec') * 1000 AS INTEGER)", "$", "?")
	}
	return &Store{db: db, dialect: d, onReject: onReject,
		upsert: r.Replace(upsertInvoice), charges: r.Replace(charges), invoices: r.Replace(listInvoices),
		customer: r.Replace(seedCustomer), usage: r.Replace(seedUsage)}
}

// Close closes the database handle.
func (s *Store) Close() error { return s.db.Close() }

// Rejected is the number of writes this store rejected for a stale fence.
func (s *Store) Rejected() int64 { return s.rejected.Load() }

// Invoice is one customer's invoice for one period.
type Invoice struct {
	CustomerID  int64
	Period      Period
	AmountCents int64
	// WrittenBy is the writer's instance id.
	WrittenBy string
	// Fence, CreatedAt and UpdatedAt are set by Invoices; WriteInvoice takes
	// the fence as an argument and the times from the database clock.
	Fence                int64
	CreatedAt, UpdatedAt time.Time
}

// WriteInvoice creates or replaces the invoice of (inv.CustomerID,
// inv.Period) under fence. It reports false, and counts a rejection, when
// the stored invoice carries a higher fence: a newer holder wrote it. An
// equal fence is accepted, so a holder may repeat its own writes.
func (s *Store) WriteInvoice(ctx context.Context, inv Invoice, fence int64) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.upsert, inv.CustomerID, s.at(inv.Period.Start), s.at(inv.Period.End),
		inv.AmountCents, fence, inv.WrittenBy)
	if err != nil {
		return false, fmt.Errorf("billing: write invoice customer %d period %s: %w", inv.CustomerID, inv.Period, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("billing: write invoice customer %d period %s: %w", inv.CustomerID, inv.Period, err)
	}
	if n == 0 {
		s.rejected.Add(1)
		if s.onReject != nil {
			s.onReject(Resource)
		}
		return false, nil
	}
	return true, nil
}

// Invoices lists the invoices of period p in customer order.
func (s *Store) Invoices(ctx context.Context, p Period) ([]Invoice, error) {
	rows, err := s.db.QueryContext(ctx, s.invoices, s.at(p.Start))
	if err != nil {
		return nil, fmt.Errorf("billing: invoices %s: %w", p, err)
	}
	defer rows.Close()
	var out []Invoice
	for rows.Next() {
		var inv Invoice
		if err := rows.Scan(&inv.CustomerID, timeCol{&inv.Period.Start}, timeCol{&inv.Period.End}, &inv.AmountCents,
			&inv.Fence, &inv.WrittenBy, timeCol{&inv.CreatedAt}, timeCol{&inv.UpdatedAt}); err != nil {
			return nil, fmt.Errorf("billing: invoices %s: %w", p, err)
		}
		out = append(out, inv)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billing: invoices %s: %w", p, err)
	}
	return out, nil
}

// Charges computes every customer's invoice for period p (amount = units ×
// rate), in customer order, without writing anything.
func (s *Store) Charges(ctx context.Context, p Period) ([]Invoice, error) {
	rows, err := s.db.QueryContext(ctx, s.charges, s.at(p.Start), s.at(p.End))
	if err != nil {
		return nil, fmt.Errorf("billing: charges %s: %w", p, err)
	}
	defer rows.Close()
	var out []Invoice
	for rows.Next() {
		var id, rate, units int64
		if err := rows.Scan(&id, &rate, &units); err != nil {
			return nil, fmt.Errorf("billing: charges %s: %w", p, err)
		}
		out = append(out, Invoice{CustomerID: id, Period: p, AmountCents: units * rate})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billing: charges %s: %w", p, err)
	}
	return out, nil
}

// Seed creates customers 1..customers and their usage in each period, unless
// present: deterministic demo data, so seeding twice changes nothing. Each
// customer gets four usage samples per period, the first at its start.
//
// It commits every seedBatch rows or so, never splitting a customer: on
// the embedded default the demo data shares the claimer's SQLite file,
// and one transaction of a large seed held its write lock for a minute
// (50,000 customers over 30 days), during which no replica could claim or
// release (an outside review). An interrupted seed leaves whole customers,
// and seeding again completes it.
func (s *Store) Seed(ctx context.Context, customers int, periods ...Period) error {
	for first := int64(1); first <= int64(customers); {
		next, err := s.seed(ctx, first, int64(customers), periods)
		if err != nil {
			return err
		}
		first = next
	}
	return nil
}

// seedBatch is about how many rows one transaction of Seed writes.
const seedBatch = 5000

// seed writes customers from first on, until it has written seedBatch rows
// or reached last, in one transaction, and returns the next customer.
func (s *Store) seed(ctx context.Context, first, last int64, periods []Period) (int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("billing: seed: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	id, rows := first, 0
	for ; id <= last && rows < seedBatch; id++ {
		if _, err := tx.ExecContext(ctx, s.customer, id, fmt.Sprintf("customer-%04d", id), DemoRate(id)); err != nil {
			return 0, fmt.Errorf("billing: seed customer %d: %w", id, err)
		}
		rows++
		for _, p := range periods {
			for _, u := range DemoUsage(id, p) {
				if _, err := tx.ExecContext(ctx, s.usage, id, s.at(u.At), u.Units); err != nil {
					return 0, fmt.Errorf("billing: seed usage of customer %d: %w", id, err)
				}
				rows++
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("billing: seed: %w", err)
	}
	return id, nil
}

// DemoRate is a seeded customer's price per unit, in cents (5 to 99).
func DemoRate(customer int64) int64 { return 5 + customer*37%95 }

// Usage is one usage sample.
type Usage struct {
	At    time.Time
	Units int64
}

// DemoUsage is the usage Seed writes for a customer in period p: four
// samples spread over the period, the first at its start.
func DemoUsage(customer int64, p Period) []Usage {
	out := make([]Usage, 4)
	step := p.End.Sub(p.Start) / 4
	for k := range out {
		at := p.Start.Add(time.Duration(k) * step).UTC().Truncate(time.Millisecond)
		units := 1 + (customer*31+at.Unix()/3600*17+int64(k)*13)%97
		out[k] = Usage{At: at, Units: units}
	}
	return out
}

// at converts t to the column type: timestamptz, or unix milliseconds.
func (s *Store) at(t time.Time) any {
	if s.dialect == migrations.SQLite {
		return t.UnixMilli()
	}
	return t.UTC()
}

// timeCol scans either column type into a UTC time.
type timeCol struct{ t *time.Time }

func (c timeCol) Scan(src any) error {
	switch v := src.(type) {
	case time.Time:
		*c.t = v.UTC()
	case int64:
		*c.t = time.UnixMilli(v).UTC()
	default:
		return fmt.Errorf("billing: cannot scan %T into a time", src)
	}
	return nil
}
