// Package backends opens every claimer kind against its real service for
// tests above the claimer level (runner, compare, benchmarks): one isolated
// namespace per call, one client per opened replica.
package backends

import (
	"context"
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
	switch kind {
	case "memory":
		s := memory.NewStore(nil)
		return func(instance string) claim.Claimer { return memory.New(s, instance) }
	case "sqlite":
		path := testenv.TempPath(t, "claims.db")
		first, err := sqlite.Open(t.Context(), path, sqlite.Options{Instance: "migrate"})
		if err != nil {
			t.Fatal(err)
		}
		_ = first.Close()
		return func(instance string) claim.Claimer {
			c, err := sqlite.Open(context.Background(), path, sqlite.Options{Instance: instance})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
	case "postgres":
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
		return func(instance string) claim.Claimer {
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg.Copy())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return postgres.New(pool, postgres.Options{Instance: instance})
		}
	case "redis":
		addr, prefix := testenv.RedisAddr(t), testenv.RandomPrefix(t.Name())
		t.Cleanup(func() { dropPrefix(addr, prefix) })
		return func(instance string) claim.Claimer {
			client := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = client.Close() })
			return redis.New(client, redis.Options{Instance: instance, Prefix: prefix})
		}
	case "redlock":
		addrs, prefix := testenv.RedlockAddrs(t, 5), testenv.RandomPrefix(t.Name())
		t.Cleanup(func() {
			for _, a := range addrs {
				dropPrefix(a, prefix)
			}
		})
		return func(instance string) claim.Claimer {
			var clients []goredis.UniversalClient
			for _, a := range addrs {
				c := goredis.NewClient(redlock.ClientOptions(a))
				t.Cleanup(func() { _ = c.Close() })
				clients = append(clients, c)
			}
			c, err := redlock.New(clients, redlock.Options{Instance: instance, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	t.Fatalf("unknown claimer kind %q", kind)
	return nil
}

// dropPrefix deletes a test's keys from a shared Redis.
func dropPrefix(addr, prefix string) {
	ctx, cancel := testenv.CleanupContext()
	defer cancel()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}
