// Package claimers opens the configured claimer. It is the one place a
// claimer kind is chosen: `scheduler run`, `scheduler compare`, the
// benchmarks and the tests all open their backends here, so they all reach
// a backend through the same code. A new backend is its own package plus
// one driver file here.
package claimers

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/migrations"
)

// Backend is an opened claimer and what it offers besides claims, as
// fields rather than interfaces to discover.
type Backend struct {
	claim.Claimer
	// Kind is claimer.kind.
	Kind string
	// Pruner forgets finished runs; nil for the backends that expire them
	// on their own (redis, redlock, memory).
	Pruner claim.Pruner
	// Controls keeps the operator's state (pauses, run requests) beside
	// the runs; every backend offers it.
	Controls claim.Controls
	// DB and Dialect are the SQL backends' database, for readiness and
	// migrations; DB is nil for the others.
	DB      *sql.DB
	Dialect migrations.Dialect
	// Lost, if not nil, is closed once the claimer stopped claiming for
	// good (sqlite: its file deleted, replaced or gone back in time;
	// postgres: its database gone back in time), and
	// LostErr then says why: only a new process claims again.
	Lost    <-chan struct{}
	LostErr func() error

	closers []func()
}

// Histories forwards to the claimer (claim.Histories), which embedding
// alone would hide.
func (b *Backend) Histories(ctx context.Context, qs []claim.HistoryQuery) ([][]claim.Record, error) {
	return claim.Histories(ctx, b.Claimer, qs)
}

var (
	_ claim.TakeoverHolder = (*Backend)(nil)
	_ claim.LossWatcher    = (*Backend)(nil)
)

// TakeoversHeld forwards to the claimer (claim.TakeoverHolder), which
// embedding alone would hide: false for one that holds none. A runner
// over a Backend (the explorer's, compare's) then sees the hold as one
// over the claimer itself does.
func (b *Backend) TakeoversHeld(lease time.Duration) bool { return claim.HeldBy(b.Claimer, lease) }

// Settle forwards to the claimer (claim.Settler), if it settles: a
// test's Backend stands for a replica up for a while.
func (b *Backend) Settle() {
	if s, ok := b.Claimer.(claim.Settler); ok {
		s.Settle()
	}
}

// WatchLoss forwards to the claimer (claim.LossWatcher), which embedding
// alone would hide; nothing for one that watches none.
func (b *Backend) WatchLoss(report func(*claim.DataLossError)) { claim.WatchLossOf(b.Claimer, report) }

// Close closes the claimer and everything opened beside it.
func (b *Backend) Close() error {
	err := b.Claimer.Close()
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	return err
}

// Ready reports whether the backend answers and, for SQL, is migrated.
func (b *Backend) Ready(ctx context.Context) error {
	if err := b.Ping(ctx); err != nil {
		return err
	}
	if b.DB == nil {
		return nil
	}
	ok, err := migrations.Current(ctx, b.DB, b.Dialect)
	if err != nil {
		return fmt.Errorf("migration status: %w", err)
	}
	if !ok {
		return errors.New("migrations pending: run `scheduler migrate up`")
	}
	return nil
}

// Options adjust Open.
type Options struct {
	// Migrate applies pending SQL migrations first (sqlite always does;
	// postgres when claimer.postgres.migrate is set).
	Migrate bool
	// Store is the memory claimer's store, which replicas in one process
	// share (nil: a store of its own).
	Store *memory.Store
}

// driver is what the opener knows of one kind.
type driver struct {
	open func(ctx context.Context, c config.Claimer, instance string, o Options) (*Backend, error)
	// servers lists the TCP addresses c dials, in a fixed order.
	servers func(c config.Claimer) []string
	// dial returns c dialling addrs instead, in servers' order.
	dial func(c config.Claimer, addrs []string) (config.Claimer, error)
	// isolate moves c to a namespace no other caller uses, ready for
	// claims, and returns what drops it.
	isolate func(ctx context.Context, c *config.Claimer, name string) (drop func() error, err error)
}

// drivers maps claimer.kind to its driver; each lives in its own file.
var drivers = map[string]driver{
	config.ClaimerMemory:   memoryDriver,
	config.ClaimerSQLite:   sqliteDriver,
	config.ClaimerPostgres: postgresDriver,
	config.ClaimerRedis:    redisDriver,
	config.ClaimerRedlock:  redlockDriver,
	config.ClaimerEtcd:     etcdDriver,
}

// Kinds lists the claimer kinds, sorted.
func Kinds() []string {
	var ks []string
	for k := range drivers {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func lookup(kind string) (driver, error) {
	d, ok := drivers[kind]
	if !ok {
		return driver{}, fmt.Errorf("claimer.kind: %q: unknown claimer (want one of %s)", kind, strings.Join(Kinds(), ", "))
	}
	return d, nil
}

// Open opens c's claimer for instance.
func Open(ctx context.Context, c config.Claimer, instance string, o Options) (*Backend, error) {
	d, err := lookup(c.Kind)
	if err != nil {
		return nil, err
	}
	b, err := d.open(ctx, c, instance, o)
	if err != nil {
		return nil, err
	}
	b.Kind = c.Kind
	if b.Controls == nil {
		b.Close()
		return nil, fmt.Errorf("claimer %s: its driver offers no controls", c.Kind)
	}
	return b, nil
}

// Servers lists the TCP addresses c's claimer dials: the postgres server,
// the redis server, the redlock nodes; none for memory, sqlite or a
// postgres socket.
func Servers(c config.Claimer) []string {
	d, err := lookup(c.Kind)
	if err != nil {
		return nil
	}
	return d.servers(c)
}

// Namespace is an isolated slice of a backend (a schema, a key prefix, a
// file, a memory store) for harnesses that run replicas side by side:
// tests, `scheduler compare`, the benchmarks.
type Namespace struct {
	// Config is the claimer configuration that reaches the namespace.
	Config config.Claimer
	store  *memory.Store
	drop   func() error
}

// Isolate prepares a fresh namespace named name (letters, digits and
// underscores) on c's backend: a migrated schema on the postgres server, a
// key prefix on the redis servers (declared new, see redisnode.MarkNew), a
// migrated file beside c's sqlite path, a store for memory.
func Isolate(ctx context.Context, c config.Claimer, name string) (*Namespace, error) {
	d, err := lookup(c.Kind)
	if err != nil {
		return nil, err
	}
	ns := &Namespace{Config: c}
	if c.Kind == config.ClaimerMemory {
		ns.store = memory.NewStore(nil)
	}
	if ns.drop, err = d.isolate(ctx, &ns.Config, name); err != nil {
		return nil, err
	}
	return ns, nil
}

// Servers lists the TCP addresses the namespace's claimers dial.
func (n *Namespace) Servers() []string { return Servers(n.Config) }

// Open opens a claimer for instance on the namespace, with a client of its
// own, as a separate replica would have.
func (n *Namespace) Open(ctx context.Context, instance string) (*Backend, error) {
	return Open(ctx, n.Config, instance, Options{Store: n.store})
}

// OpenVia is Open dialling addrs instead of Servers (in that order): a
// fault proxy in front of each server, say.
func (n *Namespace) OpenVia(ctx context.Context, instance string, addrs []string) (*Backend, error) {
	d, err := lookup(n.Config.Kind)
	if err != nil {
		return nil, err
	}
	c, err := d.dial(n.Config, addrs)
	if err != nil {
		return nil, err
	}
	return Open(ctx, c, instance, Options{Store: n.store})
}

// Drop removes the namespace and what it holds; the error says what it
// left, by name (a schema, a key prefix, a file), for the caller to report:
// compare runs on a team's servers.
func (n *Namespace) Drop() error {
	if n.drop != nil {
		return n.drop()
	}
	return nil
}

// noServers is servers for backends without a network.
func noServers(config.Claimer) []string { return nil }

// noDial is dial for backends without a network.
func noDial(c config.Claimer, addrs []string) (config.Claimer, error) {
	if len(addrs) > 0 {
		return c, fmt.Errorf("claimer %s dials no server", c.Kind)
	}
	return c, nil
}
