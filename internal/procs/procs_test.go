package procs

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

func redisOrSkip(t *testing.T) {
	if _, err := RedisBin(""); err != nil {
		t.Skip(err)
	}
}

// TestRedisCrashLosesWhatItDidNotPersist restarts a node on the same port
// and directory: empty without persistence, with its keys under an AOF.
func TestRedisCrashLosesWhatItDidNotPersist(t *testing.T) {
	redisOrSkip(t)
	for _, tc := range []struct {
		name string
		args []string
		kept bool
	}{
		{"NoPersistence", nil, false},
		{"AppendOnly", []string{"--appendonly", "yes", "--appendfsync", "always"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			r, err := StartRedis(ctx, RedisOptions{Args: tc.args})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			addr := r.Addr()
			c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
			defer c.Close()
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
			r.Crash()
			if err := c.Ping(ctx).Err(); err == nil {
				t.Fatal("ping answered after a crash")
			}
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			n, err := c.Exists(ctx, "k").Result()
			if err != nil || r.Addr() != addr || (n == 1) != tc.kept {
				t.Fatalf("after restart on %s (was %s): exists=%d, %v; want kept=%v", r.Addr(), addr, n, err, tc.kept)
			}
		})
	}
}

func TestRedisBadArgumentsSayWhy(t *testing.T) {
	redisOrSkip(t)
	_, err := StartRedis(t.Context(), RedisOptions{Args: []string{"--no-such-option", "1"}})
	if err == nil {
		t.Fatal("started with a bad option")
	}
	t.Log(err)
}

// TestPostgresCrashKeepsWhatItCommitted crashes a private cluster
// (immediate shutdown) and starts it again: it replays its WAL.
func TestPostgresCrashKeepsWhatItCommitted(t *testing.T) {
	if testing.Short() {
		t.Skip("initdb takes seconds")
	}
	ctx := t.Context()
	s, err := StartPostgres(ctx, PostgresOptions{}) // the system temp dir: the postgres account enters it under root
	if IsUnavailable(err) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, s.DSN())
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	s.Crash()
	if err := exec("SELECT 1"); err == nil {
		t.Fatal("query answered after a crash")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := exec("SELECT x FROM kept"); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}
