package benchkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redlock"
	"github.com/scheduler-dev/scheduler/internal/claim/sqlite"
	"github.com/scheduler-dev/scheduler/migrations"
)

// Services says where the real backends are. An empty field leaves out the
// rows that need it.
type Services struct {
	PostgresDSN  string
	RedisAddr    string
	RedlockAddrs []string
	// Dir holds scratch files (SQLite databases, pgbench logs).
	Dir string
}

// backend is one isolated namespace on a claimer kind: a fresh schema, key
// prefix, file or store. open returns a separate client each call, as a
// separate replica would have; close drops the namespace and every client.
type backend struct {
	open    func(instance string) (claim.Claimer, error)
	closers []func()
	// raw clients into the same namespace, for reference rows.
	pool   *pgxpool.Pool     // postgres
	schema string            // postgres
	prefix string            // redis, redlock
	rdb    []*goredis.Client // redis (1), redlock (n)
	path   string            // sqlite
}

func (b *backend) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// openBackend prepares a namespace for kind.
func (s Services) openBackend(ctx context.Context, kind string) (*backend, error) {
	b := &backend{}
	switch kind {
	case "memory":
		st := memory.NewStore(nil)
		b.open = func(instance string) (claim.Claimer, error) { return memory.New(st, instance), nil }
	case "sqlite":
		dir, err := os.MkdirTemp(s.Dir, "sqlite-")
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { _ = os.RemoveAll(dir) })
		b.path = filepath.Join(dir, "claims.db")
		b.open = func(instance string) (claim.Claimer, error) {
			c, err := sqlite.Open(ctx, b.path, sqlite.Options{Instance: instance})
			if err != nil {
				return nil, err
			}
			b.closers = append(b.closers, func() { _ = c.Close() })
			return c, nil
		}
	case "postgres":
		if s.PostgresDSN == "" {
			return nil, errors.New("no postgres DSN")
		}
		if err := b.postgresSchema(ctx, s.PostgresDSN); err != nil {
			b.close()
			return nil, err
		}
	case "redis":
		if s.RedisAddr == "" {
			return nil, errors.New("no redis address")
		}
		b.redisPrefix([]string{s.RedisAddr})
		b.open = func(instance string) (claim.Claimer, error) {
			c := redis.New(goredis.NewClient(&goredis.Options{Addr: s.RedisAddr, ContextTimeoutEnabled: true}),
				redis.Options{Instance: instance, Prefix: b.prefix, DoneTTL: 10 * time.Minute})
			b.closers = append(b.closers, func() { _ = c.Close() }) // and so its client
			return c, nil
		}
	case "redlock":
		if len(s.RedlockAddrs) == 0 {
			return nil, errors.New("no redlock nodes")
		}
		b.redisPrefix(s.RedlockAddrs)
		b.open = func(instance string) (claim.Claimer, error) {
			c, err := openRedlock(s.RedlockAddrs, b.prefix, instance)
			if err == nil {
				b.closers = append(b.closers, func() { _ = c.Close() })
			}
			return c, err
		}
	default:
		return nil, fmt.Errorf("unknown claimer kind %q", kind)
	}
	return b, nil
}

// postgresSchema creates and migrates a scratch schema, dropped by close.
func (b *backend) postgresSchema(ctx context.Context, dsn string) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	b.schema = "bench_" + randomSuffix()
	admin, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+b.schema); err != nil {
		_ = admin.Close(ctx)
		return err
	}
	b.closers = append(b.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+b.schema+" CASCADE")
		_ = admin.Close(ctx)
	})
	cfg.ConnConfig.RuntimeParams["search_path"] = b.schema
	db := stdlib.OpenDB(*cfg.ConnConfig.Copy())
	err = migrations.Up(ctx, db, migrations.Postgres)
	_ = db.Close()
	if err != nil {
		return err
	}
	newPool := func() (*pgxpool.Pool, error) {
		p, err := pgxpool.NewWithConfig(ctx, cfg.Copy())
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, p.Close)
		return p, nil
	}
	if b.pool, err = newPool(); err != nil {
		return err
	}
	b.open = func(instance string) (claim.Claimer, error) {
		p, err := newPool()
		if err != nil {
			return nil, err
		}
		return postgres.New(p, postgres.Options{Instance: instance}), nil
	}
	return nil
}

// redisPrefix picks a key prefix and raw clients on every node; close
// deletes the prefix's keys. The prefix is declared new on every node
// (redis.MarkNew), so a benchmark on a server it just started does not
// wait out the restart guard before its first claim.
func (b *backend) redisPrefix(addrs []string) {
	b.prefix = "bench:" + randomSuffix() + ":"
	for _, a := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: a, PoolSize: 64})
		b.rdb = append(b.rdb, c)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = redis.MarkNew(ctx, c, b.prefix) // a node that is down waits out the guard instead
		cancel()
		b.closers = append(b.closers, func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dropPrefix(ctx, c, b.prefix)
			_ = c.Close()
		})
	}
}

func dropPrefix(ctx context.Context, c *goredis.Client, prefix string) {
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}

// pgURL is dsn without a search_path, for pgbench (libpq takes a URI).
func pgURL(dsn string) string {
	if i := strings.Index(dsn, "search_path="); i >= 0 {
		return strings.TrimRight(dsn[:i], "?&")
	}
	return dsn
}

// openRedlock opens a Redlock claimer on addrs under prefix, with the
// clients the scheduler gives its nodes; Close closes them.
func openRedlock(addrs []string, prefix, instance string) (claim.Claimer, error) {
	clients := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		clients[i] = goredis.NewClient(redlock.ClientOptions(a))
	}
	c, err := redlock.New(clients, redlock.Options{Instance: instance, Prefix: prefix, DoneTTL: 10 * time.Minute})
	if err != nil {
		for _, cl := range clients {
			_ = cl.Close()
		}
		return nil, err
	}
	return c, nil
}
