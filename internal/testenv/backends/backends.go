// Package backends opens every claimer kind against its real service for
// tests above the claimer level (runner, compare, benchmarks) and for the
// claimers' own conformance runs: one isolated namespace per call, one
// client per opened replica.
package backends

import (
	"cmp"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redlock"
	"github.com/scheduler-dev/scheduler/internal/claim/sqlite"
	"github.com/scheduler-dev/scheduler/internal/testenv"
	"github.com/scheduler-dev/scheduler/migrations"
)

// Kinds lists every claimer kind.
var Kinds = []string{"memory", "sqlite", "postgres", "redis", "redlock"}

// Open prepares an isolated namespace for kind and returns an opener of
// claimers sharing it, each a separate client. Everything is closed and
// dropped when t ends.
func Open(t testing.TB, kind string) func(instance string) claim.Claimer {
	t.Helper()
	return Prepare(t, kind, Options{}).Open
}

// Factory is Open as a claimtest.Factory: the conformance suite's cases
// each get a fresh namespace prepared with opts.
func Factory(kind string, opts Options) func(t *testing.T) func(instance string) claim.Claimer {
	return func(t *testing.T) func(instance string) claim.Claimer {
		t.Helper()
		return Prepare(t, kind, opts).Open
	}
}

// Options adjust Prepare; the zero value is what Open uses.
type Options struct {
	// Servers are the redis server or the redlock nodes to use instead of
	// testenv's (five nodes for redlock): a private server a test
	// restarts, say, or nodes many tests share.
	Servers []string
	// Redis and Redlock are the claimers' options; Open sets Instance and
	// Prefix.
	Redis   redis.Options
	Redlock redlock.Options
}

// Namespace is one isolated namespace on a kind's service.
type Namespace struct {
	// Servers are what the claimers dial: the postgres host:port, the
	// redis server or the redlock nodes; none for memory and sqlite.
	Servers []string
	// Prefix is the redis and redlock claimers' key prefix.
	Prefix string
	open   func(instance string, c Client) claim.Claimer
}

// Client shapes one opened claimer's connections.
type Client struct {
	// Via maps a server's address to the one this claimer dials instead
	// (a fault proxy's, say); servers not in it are dialled directly.
	Via map[string]string
	// MaxConns caps a postgres pool (0: pgxpool's default).
	MaxConns int32
}

// Open opens a claimer for instance with its own client, closed when the
// Prepare's t ends.
func (n *Namespace) Open(instance string) claim.Claimer { return n.open(instance, Client{}) }

// OpenClient is Open with the client shaped by c.
func (n *Namespace) OpenClient(instance string, c Client) claim.Claimer { return n.open(instance, c) }

func (c Client) dial(addr string) string {
	if via, ok := c.Via[addr]; ok {
		return via
	}
	return addr
}

// Prepare prepares an isolated namespace for kind. Everything it and its
// claimers open is closed and dropped when t ends.
func Prepare(t testing.TB, kind string, opts Options) *Namespace {
	t.Helper()
	switch kind {
	case "memory":
		s := memory.NewStore(nil)
		return &Namespace{open: func(instance string, _ Client) claim.Claimer { return memory.New(s, instance) }}
	case "sqlite":
		path := MigratedFile(t)
		return &Namespace{open: func(instance string, _ Client) claim.Claimer {
			c, err := sqlite.Open(context.Background(), path, sqlite.Options{Instance: instance})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}}
	case "postgres":
		cfg := MigratedSchema(t)
		addr := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
		return &Namespace{Servers: []string{addr}, open: func(instance string, cl Client) claim.Claimer {
			c := cfg.Copy()
			c.MaxConns = cmp.Or(cl.MaxConns, c.MaxConns)
			if via := cl.dial(addr); via != addr {
				host, port, err := net.SplitHostPort(via)
				if err != nil {
					t.Fatal(err)
				}
				p, err := strconv.ParseUint(port, 10, 16)
				if err != nil {
					t.Fatal(err)
				}
				c.ConnConfig.Host, c.ConnConfig.Port = host, uint16(p)
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return postgres.New(pool, postgres.Options{Instance: instance})
		}}
	case "redis":
		addrs := opts.Servers
		if len(addrs) == 0 {
			addrs = []string{testenv.RedisAddr(t)}
		}
		ns := &Namespace{Servers: addrs, Prefix: testenv.RedisPrefix(t, addrs...)}
		markNew(t, addrs, ns.Prefix)
		ns.open = func(instance string, cl Client) claim.Claimer {
			client := goredis.NewClient(&goredis.Options{Addr: cl.dial(addrs[0]), ContextTimeoutEnabled: true})
			o := opts.Redis
			o.Instance, o.Prefix = instance, ns.Prefix
			c := redis.New(client, o)
			t.Cleanup(func() { _ = c.Close() }) // and so the client
			return c
		}
		return ns
	case "redlock":
		addrs := opts.Servers
		if len(addrs) == 0 {
			addrs = testenv.RedlockAddrs(t, 5)
		}
		ns := &Namespace{Servers: addrs, Prefix: testenv.RedisPrefix(t, addrs...)}
		markNew(t, addrs, ns.Prefix)
		ns.open = func(instance string, cl Client) claim.Claimer {
			clients := make([]goredis.UniversalClient, len(addrs))
			for i, a := range addrs {
				c := goredis.NewClient(redlock.ClientOptions(cl.dial(a)))
				t.Cleanup(func() { _ = c.Close() })
				clients[i] = c
			}
			o := opts.Redlock
			o.Instance, o.Prefix = instance, ns.Prefix
			c, err := redlock.New(clients, o)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		return ns
	}
	t.Fatalf("unknown claimer kind %q", kind)
	return nil
}

// markNew declares the namespace under prefix new on every server
// (redis.MarkNew): its first claims need not wait out the restart guard
// that a young server (one the test just started) would otherwise hold.
func markNew(t testing.TB, addrs []string, prefix string) {
	t.Helper()
	ctx, cancel := testenv.CleanupContext()
	defer cancel()
	for _, addr := range addrs {
		client := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		err := redis.MarkNew(ctx, client, prefix)
		_ = client.Close()
		switch {
		case errors.Is(err, claim.ErrUnavailable):
			// A node the test keeps down; its first claims once up wait.
			t.Logf("mark namespace %s new on %s: %v", prefix, addr, err)
		case err != nil:
			t.Fatalf("mark namespace %s new on %s: %v", prefix, addr, err)
		}
	}
}

// MigratedSchema creates a private, migrated schema on the test server and
// returns a pool config whose connections use it. The schema is dropped
// when t ends.
func MigratedSchema(t testing.TB) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg.ConnConfig.Copy())
	err = migrations.Up(t.Context(), db, migrations.Postgres)
	_ = db.Close()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// MigratedFile returns the path of a fresh, migrated SQLite file, in a
// testenv.FastDir: the tests that use it run leases of hundreds of ms. It
// is migrated here, before replicas race to open it.
func MigratedFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(testenv.FastDir(t), "claims.db")
	c, err := sqlite.Open(t.Context(), path, sqlite.Options{Instance: "migrate"})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	return path
}
