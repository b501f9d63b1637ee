package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/memory"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/claim/redis"
	"github.com/scheduler-dev/scheduler/internal/claim/redlock"
	"github.com/scheduler-dev/scheduler/internal/claim/sqlite"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/migrations"
)

// backend is the opened claimer plus what readiness and migrate need.
type backend struct {
	claim.Claimer
	db      *sql.DB // SQL backends: for migrations and readiness
	dialect migrations.Dialect
	close   []func()
}

func (b *backend) Close() error {
	err := b.Claimer.Close()
	for i := len(b.close) - 1; i >= 0; i-- {
		b.close[i]()
	}
	return err
}

// ready reports whether the backend answers and, for SQL, is migrated.
func (b *backend) ready(ctx context.Context) error {
	if err := b.Ping(ctx); err != nil {
		return err
	}
	if b.db == nil {
		return nil
	}
	ok, err := migrations.Current(ctx, b.db, b.dialect)
	if err != nil {
		return fmt.Errorf("migration status: %w", err)
	}
	if !ok {
		return errors.New("migrations pending: run `scheduler migrate up`")
	}
	return nil
}

// openBackend is the one place a claimer kind is chosen. migrate applies
// pending SQL migrations first (sqlite always; postgres when configured).
func openBackend(ctx context.Context, cfg *config.Config, migrate bool) (*backend, error) {
	c := cfg.Claimer
	instance := cfg.InstanceID
	switch c.Kind {
	case config.ClaimerMemory:
		return &backend{Claimer: memory.New(memory.NewStore(nil), instance)}, nil
	case config.ClaimerSQLite:
		cl, err := sqlite.Open(ctx, c.SQLite.Path, sqlite.Options{Instance: instance,
			SyncNormal: c.SQLite.Synchronous == config.SyncNormal})
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("sqlite", sqlite.DSN(c.SQLite.Path))
		if err != nil {
			_ = cl.Close()
			return nil, err
		}
		return &backend{Claimer: cl, db: db, dialect: migrations.SQLite, close: []func(){func() { _ = db.Close() }}}, nil
	case config.ClaimerPostgres:
		pc, err := pgxpool.ParseConfig(c.Postgres.DSN)
		if err != nil {
			return nil, fmt.Errorf("postgres: claimer.postgres.dsn: %v", err) // pgx redacts the password
		}
		if c.Postgres.Password != "" {
			pc.ConnConfig.Password = string(c.Postgres.Password)
		}
		if c.Postgres.MaxConns > 0 {
			pc.MaxConns = int32(c.Postgres.MaxConns)
		}
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		db := stdlib.OpenDBFromPool(pool)
		b := &backend{Claimer: postgres.New(pool, postgres.Options{Instance: instance}), db: db, dialect: migrations.Postgres,
			close: []func(){pool.Close, func() { _ = db.Close() }}}
		if migrate && c.Postgres.Migrate {
			if err := migrations.Up(ctx, db, migrations.Postgres); err != nil {
				_ = b.Close()
				return nil, fmt.Errorf("postgres: migrate up: %w", err)
			}
		}
		return b, nil
	case config.ClaimerRedis:
		// ContextTimeoutEnabled: claim calls carry deadlines shorter than
		// the lease, and a hung server must not outlive them.
		opts := &goredis.Options{Addr: c.Redis.Addr, ContextTimeoutEnabled: true}
		client, err := redisClient(opts, c.Redis.Username, string(c.Redis.Password), c.Redis.DB, c.Redis.TLS)
		if err != nil {
			return nil, err
		}
		cl, err := redis.Open(ctx, client, redis.Options{Instance: instance, Prefix: c.Redis.Prefix,
			DoneTTL: c.Redis.DoneTTL.Duration(), AllowEviction: c.Redis.AllowEviction})
		if err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("redis %s: %w", c.Redis.Addr, err)
		}
		return &backend{Claimer: cl}, nil
	case config.ClaimerRedlock:
		var clients []goredis.UniversalClient
		for _, addr := range c.Redlock.Addrs {
			client, err := redisClient(redlock.ClientOptions(addr), c.Redlock.Username, string(c.Redlock.Password), 0, c.Redlock.TLS)
			if err != nil {
				return nil, err
			}
			clients = append(clients, client)
		}
		cl, err := redlock.New(clients, redlock.Options{Instance: instance, Prefix: c.Redlock.Prefix,
			DoneTTL: c.Redlock.DoneTTL.Duration(), NodeTimeout: c.Redlock.NodeTimeout.Duration()})
		if err != nil {
			for _, cc := range clients {
				_ = cc.Close()
			}
			return nil, fmt.Errorf("redlock: %w", err)
		}
		return &backend{Claimer: cl}, nil
	}
	return nil, fmt.Errorf("claimer.kind: %q: unknown claimer", c.Kind)
}

// redisClient opens one Redis connection pool; base carries the claimer's
// own settings (redlock.ClientOptions for Redlock nodes).
func redisClient(base *goredis.Options, user, password string, db int, t config.TLS) (*goredis.Client, error) {
	tc, err := t.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("redis %s: tls: %w", base.Addr, err)
	}
	base.Username, base.Password, base.DB, base.TLSConfig = user, password, db, tc
	return goredis.NewClient(base), nil
}

// newLogger builds the process logger from log.level and log.format. It
// also becomes go-redis's logger, which is process-wide.
func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level)) // validated already
	opts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	if cfg.Log.Format == "json" {
		log = slog.New(slog.NewJSONHandler(w, opts))
	} else {
		log = slog.New(slog.NewTextHandler(w, opts))
	}
	goredis.SetLogger(redisLogger{log.With("component", "go-redis")})
	return log
}

// redisLogger takes go-redis's own messages (a pool that cannot dial, …),
// which it would print as plain text on stderr, into the process log, where
// JSON stays JSON. They repeat failures the caller logs once at error, so
// they go to debug.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...))
}
