package billing

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/job"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// opener opens one more Store on the test's database, as another replica
// would; the store is closed when the test ends.
type opener func(t *testing.T, onReject func(string)) *Store

// eachDialect runs f against a fresh SQLite file and a fresh PostgreSQL
// schema, in parallel.
func eachDialect(t *testing.T, f func(t *testing.T, open opener)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "billing.db")
		f(t, opener(func(t *testing.T, onReject func(string)) *Store {
			return openStore(t, Options{Database: job.Database{Kind: KindSQLite, Path: path}, OnReject: onReject})
		}))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dsn := schemaDSN(t, testenv.PostgresDSN(t))
		f(t, opener(func(t *testing.T, onReject func(string)) *Store {
			return openStore(t, Options{Database: job.Database{Kind: KindPostgres, DSN: dsn}, OnReject: onReject})
		}))
	})
}

func openStore(t *testing.T, o Options) *Store {
	t.Helper()
	s, err := Open(t.Context(), o)
	if err != nil {
		t.Fatalf("open %s: %v", o.Database.Kind, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// schemaDSN creates a private schema and returns dsn with its search_path.
func schemaDSN(t *testing.T, dsn string) string {
	t.Helper()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	schema := pgx.Identifier{"t_" + hex.EncodeToString(b)}.Sanitize()
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	if _, err := admin.ExecContext(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := testenv.CleanupContext()
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema[1:len(schema)-1]) // unquoted: hex names need no quoting
	u.RawQuery = q.Encode()
	return u.String()
}

func day(s string) Period {
	t, err := time.Parse(dateLayout, s)
	if err != nil {
		panic(err)
	}
	return Day(t)
}

func TestPeriodFor(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin") // time/tzdata is compiled in
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		at   time.Time
		want string
	}{
		{"EarlyMorning", time.Date(2026, 3, 2, 2, 30, 0, 0, time.UTC), "2026-03-01"},
		{"Midnight", time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC), "2026-03-01"},
		{"LastInstantOfDay", time.Date(2026, 3, 2, 23, 59, 59, 999, time.UTC), "2026-03-01"},
		{"YearBoundary", time.Date(2026, 1, 1, 2, 30, 0, 0, time.UTC), "2025-12-31"},
		{"LeapDay", time.Date(2028, 3, 1, 2, 30, 0, 0, time.UTC), "2028-02-29"},
		// 00:30 in Berlin is still the previous day in UTC.
		{"ZoneIsIgnored", time.Date(2026, 3, 2, 0, 30, 0, 0, berlin), "2026-02-28"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := PeriodFor(tc.at)
			if p.String() != tc.want || p.End.Sub(p.Start) != 24*time.Hour {
				t.Fatalf("PeriodFor(%v) = %v, want the UTC day %s", tc.at, p, tc.want)
			}
		})
	}
}

func TestParams(t *testing.T) {
	at := time.Date(2026, 3, 2, 2, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		params  job.Params
		want    string // the period billed, or the error's key
		wantErr bool
	}{
		{"Absent", nil, "2026-03-01", false},
		{"Date", job.Params{"period": "2025-12-24"}, "2025-12-24", false},
		{"YAMLTimestamp", job.Params{"period": time.Date(2025, 12, 24, 0, 0, 0, 0, time.UTC)}, "2025-12-24", false},
		{"Pace", job.Params{"pace": "40ms"}, "2026-03-01", false},
		{"NotADate", job.Params{"period": "yesterday"}, "params.period", true},
		{"WrongType", job.Params{"period": 3}, "params.period", true},
		{"NotAWholeDay", job.Params{"period": "2025-12-24T05:00:00Z"}, "params.period", true},
		{"NegativePace", job.Params{"pace": "-1s"}, "params.pace", true},
		{"UnknownKey", job.Params{"currency": "EUR"}, "params.currency", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Params
			err := tc.params.Decode(&p)
			var pe *job.ParamError
			switch {
			case tc.wantErr && (!errors.As(err, &pe) || pe.ConfigKey() != tc.want):
				t.Fatalf("Decode(%v) = %v, want an error at %s", tc.params, err, tc.want)
			case !tc.wantErr && err != nil:
				t.Fatalf("Decode(%v) = %v", tc.params, err)
			case !tc.wantErr && p.period(at).String() != tc.want:
				t.Fatalf("period = %v, want %s", p.period(at), tc.want)
			}
		})
	}
}

func TestWriteInvoice(t *testing.T) {
	eachDialect(t, func(t *testing.T, open opener) {
		ctx := t.Context()
		var callbacks atomic.Int64
		s := open(t, func(resource string) {
			if resource != Resource {
				t.Errorf("rejection of resource %q, want %q", resource, Resource)
			}
			callbacks.Add(1)
		})
		p1, p2 := day("2026-03-01"), day("2026-03-02")
		if err := s.Seed(ctx, 2, p1, p2); err != nil {
			t.Fatal(err)
		}
		write := func(customer, amount, fence int64, p Period, wantAccepted bool) {
			t.Helper()
			ok, err := s.WriteInvoice(ctx, Invoice{CustomerID: customer, Period: p, AmountCents: amount, WrittenBy: fmt.Sprint("f", fence)}, fence)
			if err != nil || ok != wantAccepted {
				t.Fatalf("write customer %d fence %d: accepted %v, %v; want accepted %v", customer, fence, ok, err, wantAccepted)
			}
		}
		wantInvoice := func(p Period, customer, amount, fence int64) {
			t.Helper()
			invs, err := s.Invoices(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			for _, inv := range invs {
				if inv.CustomerID != customer {
					continue
				}
				if inv.AmountCents != amount || inv.Fence != fence || inv.WrittenBy != fmt.Sprint("f", fence) ||
					inv.Period != p || inv.CreatedAt.IsZero() || inv.UpdatedAt.Before(inv.CreatedAt) {
					t.Fatalf("invoice %+v, want amount %d fence %d period %v", inv, amount, fence, p)
				}
				return
			}
			t.Fatalf("no invoice for customer %d in %v", customer, p)
		}

		t.Run("HigherFenceReplaces", func(t *testing.T) {
			write(1, 100, 5, p1, true)
			write(1, 110, 6, p1, true)
			wantInvoice(p1, 1, 110, 6)
		})
		t.Run("EqualFenceIsAccepted", func(t *testing.T) {
			write(1, 120, 6, p1, true)
			wantInvoice(p1, 1, 120, 6)
		})
		t.Run("LowerFenceIsRejectedAndCounted", func(t *testing.T) {
			write(1, 999, 5, p1, false)
			write(1, 999, 1, p1, false)
			wantInvoice(p1, 1, 120, 6)
			if s.Rejected() != 2 || callbacks.Load() != 2 {
				t.Fatalf("rejected %d, callbacks %d; want 2 and 2", s.Rejected(), callbacks.Load())
			}
		})
		t.Run("FenceIsPerCustomerAndPeriod", func(t *testing.T) {
			// Documented: the high-water mark is per invoice row.
			write(2, 200, 1, p1, true)
			write(1, 300, 1, p2, true)
			wantInvoice(p1, 2, 200, 1)
			wantInvoice(p2, 1, 300, 1)
		})
		t.Run("OneInvoicePerCustomerAndPeriod", func(t *testing.T) {
			for _, p := range []Period{p1, p2} {
				invs, err := s.Invoices(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				seen := map[int64]bool{}
				for _, inv := range invs {
					if seen[inv.CustomerID] {
						t.Fatalf("two invoices for customer %d in %v", inv.CustomerID, p)
					}
					seen[inv.CustomerID] = true
				}
			}
			// The constraint holds even for a writer that bypasses the upsert.
			q := "INSERT INTO billing_invoices (customer_id, period_start, period_end, amount_cents, fence, written_by) VALUES ($1, $2, $3, 1, 99, 'rogue')"
			if s.dialect == KindSQLite {
				q = "INSERT INTO billing_invoices (customer_id, period_start, period_end, amount_cents, fence, written_by) VALUES (?1, ?2, ?3, 1, 99, 'rogue')"
			}
			if _, err := s.db.ExecContext(ctx, q, 1, s.at(p1.Start), s.at(p1.End)); err == nil {
				t.Fatal("a second invoice for (customer 1, period) was inserted")
			}
			wantInvoice(p1, 1, 120, 6)
		})
	})
}

func TestSeedIsDeterministic(t *testing.T) {
	eachDialect(t, func(t *testing.T, open opener) {
		ctx := t.Context()
		s := open(t, nil)
		p := day("2026-03-01")
		for range 2 {
			if err := s.Seed(ctx, 3, p); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.Charges(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		want := expectedAmounts(t, s, p)
		if len(got) != 3 {
			t.Fatalf("charges for %d customers, want 3", len(got))
		}
		for _, inv := range got {
			if inv.AmountCents != want[inv.CustomerID] || inv.AmountCents == 0 {
				t.Fatalf("customer %d: charge %d, want %d (non-zero)", inv.CustomerID, inv.AmountCents, want[inv.CustomerID])
			}
		}
		// The next day's first sample sits at this period's end: excluded.
		none, err := s.Charges(ctx, day("2026-02-28"))
		if err != nil {
			t.Fatal(err)
		}
		for _, inv := range none {
			if inv.AmountCents != 0 {
				t.Fatalf("customer %d charged %d for a day without usage", inv.CustomerID, inv.AmountCents)
			}
		}
	})
}

// TestALargeSeedCommitsInBatches: on the embedded default the demo data
// shares the claimer's SQLite file, so a seed must not hold its write lock
// for the whole insert. One transaction writes about seedBatch rows, never
// a customer in part, and the batches together seed every customer.
func TestALargeSeedCommitsInBatches(t *testing.T) {
	eachDialect(t, func(t *testing.T, open opener) {
		ctx := t.Context()
		s := open(t, nil)
		p := day("2026-03-01")
		perCustomer := 1 + len(DemoUsage(1, p)) // its row and its usage
		next, err := s.seed(ctx, 1, 1_000_000, []Period{p})
		if err != nil {
			t.Fatal(err)
		}
		if want := 1 + int64((seedBatch+perCustomer-1)/perCustomer); next != want {
			t.Fatalf("one transaction seeded customers up to %d, want %d (%d rows of %d each)", next-1, want-1, seedBatch, perCustomer)
		}
		const customers = 2500
		if err := s.Seed(ctx, customers, p); err != nil {
			t.Fatal(err)
		}
		got, err := s.Charges(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != customers {
			t.Fatalf("charges for %d customers, want %d", len(got), customers)
		}
		want := expectedAmounts(t, s, p)
		for _, inv := range got {
			if inv.AmountCents != want[inv.CustomerID] || inv.AmountCents == 0 {
				t.Fatalf("customer %d: charge %d, want %d (non-zero)", inv.CustomerID, inv.AmountCents, want[inv.CustomerID])
			}
		}
	})
}

// expectedAmounts sums the raw usage rows of p in Go, independently of the
// store's SQL aggregate.
func expectedAmounts(t *testing.T, s *Store, p Period) map[int64]int64 {
	t.Helper()
	ctx := t.Context()
	rates := map[int64]int64{}
	rows, err := s.db.QueryContext(ctx, "SELECT id, rate_cents FROM billing_customers")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, rate int64
		if err := rows.Scan(&id, &rate); err != nil {
			t.Fatal(err)
		}
		rates[id] = rate
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	_ = rows.Close()
	out := map[int64]int64{}
	for id := range rates {
		out[id] = 0
	}
	rows, err = s.db.QueryContext(ctx, "SELECT customer_id, at, units FROM billing_usage")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, units int64
		var at time.Time
		if err := rows.Scan(&id, timeCol{&at}, &units); err != nil {
			t.Fatal(err)
		}
		if !at.Before(p.Start) && at.Before(p.End) {
			out[id] += units * rates[id]
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestHandlerStopsWhenContextEnds(t *testing.T) {
	eachDialect(t, func(t *testing.T, open opener) {
		s := open(t, nil)
		p := day("2026-03-01")
		if err := s.Seed(t.Context(), 20, p); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		s.beforeWrite = func(_ job.Run, written int) {
			if written == 5 {
				cancel(job.ErrLeaseLost) // as the runner's keep-alive does
			}
		}
		err := Handler(s)(ctx, job.Run{Job: JobName, ScheduledAt: p.End.Add(time.Hour), Fence: 1, Attempt: 1,
			Instance: "r1", Logger: testLogger(t)})
		if !errors.Is(err, job.ErrLeaseLost) {
			t.Fatalf("handler returned %v, want the context's cause ErrLeaseLost", err)
		}
		invs, err := s.Invoices(t.Context(), p)
		if err != nil || len(invs) != 5 {
			t.Fatalf("%d invoices (%v), want the 5 written before the cancellation", len(invs), err)
		}
	})
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// fakeClock is the memory claimer's clock: the test expires leases by
// advancing it instead of sleeping.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *fakeClock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// replica is one scheduler replica: its own claimer view and its own
// database handle, as separate processes would have.
type replica struct {
	name    string
	claimer *memory.Claimer
	store   *Store
	handler job.Handler
}

// pause makes the holder with a given fence block before its n-th write
// until resume is closed, as a holder stalled by a GC pause, a stopped VM or
// a network partition would. After resume, its write attempts are counted
// as stale.
type pause struct {
	at             int
	paused, resume chan struct{}
	stale          atomic.Int64
}

// TestTakeover is the billing scenario: 3 replicas bill 5 periods of 100
// customers. In two periods the holder stalls mid-run, its lease expires and
// another replica takes the run over with a higher fence and finishes it;
// in one of them the successor stalls too and the third replica finishes.
// Then the stale holders resume. Their writes must be rejected and counted,
// and each period must end with exactly one correct invoice per customer,
// written by the final holder.
func TestTakeover(t *testing.T) {
	const (
		customers = 100
		lease     = 500 * time.Millisecond
	)
	periods := []Period{day("2026-03-01"), day("2026-03-02"), day("2026-03-03"), day("2026-03-04"), day("2026-03-05")}
	// Period index → where each successive holder stalls; the holder after
	// the last stall finishes the run.
	stalls := map[int][]int{1: {40}, 3: {30, 60}}

	eachDialect(t, func(t *testing.T, open opener) {
		ctx := t.Context()
		clock := &fakeClock{now: time.Date(2026, 3, 6, 0, 0, 0, 0, time.UTC)}
		claims := memory.NewStore(clock.Now)
		var callbacks atomic.Int64
		var mu sync.Mutex
		pauses := map[int64]*pause{} // by fence
		replicas := make([]*replica, 3)
		for i := range replicas {
			r := &replica{name: fmt.Sprintf("replica-%d", i+1)}
			r.claimer = memory.New(claims, r.name)
			r.store = open(t, func(string) { callbacks.Add(1) })
			r.store.beforeWrite = func(run job.Run, written int) {
				mu.Lock()
				p := pauses[run.Fence]
				mu.Unlock()
				if p == nil {
					return
				}
				select {
				case <-p.resume:
					p.stale.Add(1)
					return
				default:
				}
				if written == p.at {
					close(p.paused)
					<-p.resume
					p.stale.Add(1)
				}
			}
			r.handler = Handler(r.store)
			replicas[i] = r
		}
		if err := replicas[0].store.Seed(ctx, customers, periods...); err != nil {
			t.Fatal(err)
		}
		execute := func(r *replica, cl *claim.Claim) error {
			return r.handler(ctx, job.Run{Job: JobName, ScheduledAt: cl.Run.At, ID: cl.ID(), Fence: cl.Fence,
				Attempt: cl.Attempt, Instance: r.name, Logger: testLogger(t).With("instance", r.name, "fence", cl.Fence)})
		}

		final := map[int]*claim.Claim{} // period index → the claim that finished it
		var stale []*pause
		for pi, p := range periods {
			// The run every replica computes from the schedule "30 2 * * *".
			run := claim.Run{Job: JobName, At: p.End.Add(2*time.Hour + 30*time.Minute)}
			holder, cl := race(t, replicas, run, lease)
			type stalled struct {
				r    *replica
				cl   *claim.Claim
				p    *pause
				done chan error
			}
			var stalledHolders []stalled
			for _, at := range stalls[pi] {
				ps := &pause{at: at, paused: make(chan struct{}), resume: make(chan struct{})}
				mu.Lock()
				pauses[cl.Fence] = ps
				mu.Unlock()
				done := make(chan error, 1)
				go func(r *replica, cl *claim.Claim) { done <- execute(r, cl) }(holder, cl)
				select {
				case <-ps.paused:
				case err := <-done:
					t.Fatalf("%s finished (%v) instead of stalling after %d invoices", holder.name, err, at)
				case <-time.After(time.Minute):
					t.Fatalf("%s did not reach invoice %d", holder.name, at)
				}
				stalledHolders = append(stalledHolders, stalled{holder, cl, ps, done})
				// The stalled holder cannot renew; its lease runs out.
				clock.Advance(2 * lease)
				next := idle(replicas, func(r *replica) bool {
					return slices.ContainsFunc(stalledHolders, func(s stalled) bool { return s.r == r })
				})
				succ, err := claim.ClaimOne(ctx, next.claimer, run, lease)
				if err != nil {
					t.Fatalf("%s: takeover after the lease expired: %v", next.name, err)
				}
				if succ.Fence <= cl.Fence || succ.Attempt != cl.Attempt+1 {
					t.Fatalf("takeover fence %d attempt %d, after fence %d attempt %d", succ.Fence, succ.Attempt, cl.Fence, cl.Attempt)
				}
				holder, cl = next, succ
			}
			if err := execute(holder, cl); err != nil {
				t.Fatalf("%s: period %v: %v", holder.name, p, err)
			}
			if err := claim.ReleaseOne(ctx, holder.claimer, cl, claim.Succeeded); err != nil {
				t.Fatalf("%s: release: %v", holder.name, err)
			}
			final[pi] = cl
			// The stale holders wake up, most recent first, still believing
			// they hold the run (they never saw their context end).
			for i := len(stalledHolders) - 1; i >= 0; i-- {
				s := stalledHolders[i]
				close(s.p.resume)
				if err := <-s.done; !errors.Is(err, job.ErrLeaseLost) {
					t.Fatalf("%s (stale, fence %d): handler returned %v, want ErrLeaseLost", s.r.name, s.cl.Fence, err)
				}
				if err := claim.ReleaseOne(ctx, s.r.claimer, s.cl, claim.Succeeded); !errors.Is(err, claim.ErrLeaseLost) {
					t.Fatalf("%s (stale): release %v, want ErrLeaseLost", s.r.name, err)
				}
				stale = append(stale, s.p)
			}
			for _, r := range replicas {
				if _, err := claim.ClaimOne(ctx, r.claimer, run, lease); !errors.Is(err, claim.ErrDone) {
					t.Fatalf("%s: claim of a finished run: %v, want ErrDone", r.name, err)
				}
			}
		}

		// Exactly 500 invoices, each correct, each by the final holder.
		var count int64
		if err := replicas[0].store.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM billing_invoices").Scan(&count); err != nil {
			t.Fatal(err)
		}
		if count != int64(len(periods)*customers) {
			t.Fatalf("%d invoices, want %d", count, len(periods)*customers)
		}
		var total, wantTotal int64
		for pi, p := range periods {
			want := expectedAmounts(t, replicas[1].store, p)
			invs, err := replicas[2].store.Invoices(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if len(invs) != customers {
				t.Fatalf("period %v: %d invoices, want %d", p, len(invs), customers)
			}
			for _, inv := range invs {
				if inv.AmountCents != want[inv.CustomerID] {
					t.Errorf("period %v customer %d: amount %d, want %d", p, inv.CustomerID, inv.AmountCents, want[inv.CustomerID])
				}
				if inv.Fence != final[pi].Fence || inv.WrittenBy != final[pi].Holder {
					t.Errorf("period %v customer %d: written by %s fence %d, want the final holder %s fence %d",
						p, inv.CustomerID, inv.WrittenBy, inv.Fence, final[pi].Holder, final[pi].Fence)
				}
				total += inv.AmountCents
				wantTotal += want[inv.CustomerID]
			}
		}
		if total != wantTotal || total == 0 {
			t.Fatalf("total %d, want %d", total, wantTotal)
		}

		// Every stale write attempted was rejected and counted; each stale
		// holder stopped at its first.
		var attempted, rejected int64
		for _, p := range stale {
			attempted += p.stale.Load()
		}
		for _, r := range replicas {
			rejected += r.store.Rejected()
		}
		if attempted != 3 || rejected != attempted || callbacks.Load() != attempted {
			t.Fatalf("stale writes attempted %d, rejected %d, reported %d; want 3 each", attempted, rejected, callbacks.Load())
		}
	})
}

// race has every replica bid for run at once and returns the single winner.
func race(t *testing.T, replicas []*replica, run claim.Run, lease time.Duration) (*replica, *claim.Claim) {
	t.Helper()
	claims := make([]*claim.Claim, len(replicas))
	errs := make([]error, len(replicas))
	var wg sync.WaitGroup
	for i, r := range replicas {
		wg.Go(func() { claims[i], errs[i] = claim.ClaimOne(t.Context(), r.claimer, run, lease) })
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("%s and %s both won %s", replicas[winner].name, replicas[i].name, run.ID())
		case err == nil:
			winner = i
		case !errors.Is(err, claim.ErrHeld):
			t.Fatalf("%s: claim %s: %v", replicas[i].name, run.ID(), err)
		}
	}
	if winner < 0 {
		t.Fatalf("nobody won %s", run.ID())
	}
	return replicas[winner], claims[winner]
}

// idle returns the first replica busy does not report.
func idle(replicas []*replica, busy func(*replica) bool) *replica {
	for _, r := range replicas {
		if !busy(r) {
			return r
		}
	}
	panic("no idle replica")
}

// TestOpener opens billing.nightly as the CLI does: on the database block,
// migrated, with scheduler_fence_rejections_total exported at 0 before any
// rejection; opening it again (another run of the command in one process)
// keeps counting in the same metric.
func TestOpener(t *testing.T) {
	prom := prometheus.NewRegistry()
	res := job.Resources{Database: job.Database{Kind: KindSQLite, Path: filepath.Join(t.TempDir(), "billing.db")}, Metrics: prom}
	for range 2 {
		h, closeStore, err := Opener(t.Context(), res)
		if err != nil {
			t.Fatal(err)
		}
		if err := h(t.Context(), job.Run{Job: JobName, ScheduledAt: time.Now(), Fence: 1, Logger: testLogger(t)}); err != nil {
			t.Fatal(err)
		}
		if err := closeStore(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := testutil.GatherAndCount(prom, "scheduler_fence_rejections_total"); err != nil || n != 1 {
		t.Fatalf("scheduler_fence_rejections_total series: %d, %v; want 1", n, err)
	}
	if _, _, err := Opener(t.Context(), job.Resources{Database: job.Database{Kind: "mysql"}}); err == nil {
		t.Fatal("opened an unknown database kind")
	}
}
