package procs_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/procs"
	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// redisOrSkip skips without redis-server, or fails when the services are
// required (CI).
func redisOrSkip(t *testing.T) {
	if _, err := procs.RedisBin(""); err != nil {
		testenv.Missing(t, "redis-server", err.Error())
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
			r, err := procs.StartRedis(ctx, procs.RedisOptions{Args: tc.args})
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
	_, err := procs.StartRedis(t.Context(), procs.RedisOptions{Args: []string{"--no-such-option", "1"}})
	if err == nil {
		t.Fatal("started with a bad option")
	}
	t.Log(err)
}

// TestPostgresCrashKeepsWhatItCommitted crashes a private cluster
// (immediate shutdown) and starts it again: it replays its WAL. Then it
// pauses it (Pause, as a stalled host) and resumes it.
func TestPostgresCrashKeepsWhatItCommitted(t *testing.T) {
	if testing.Short() {
		t.Skip("initdb takes seconds")
	}
	ctx := t.Context()
	s, err := procs.StartPostgres(ctx, procs.PostgresOptions{}) // the system temp dir: the postgres account enters it under root
	if procs.IsUnavailable(err) {
		testenv.Missing(t, "initdb", err.Error())
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

	// Paused, the cluster answers nothing, on a connection open before
	// or one opened meanwhile; resumed, the open connection's query is
	// answered.
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = s.Resume()
		}
	}()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := pgx.Connect(short, s.DSN()); err == nil {
		t.Fatal("a new connection was answered while paused")
	}
	answered := make(chan error, 1)
	go func() {
		var x int
		answered <- conn.QueryRow(ctx, "SELECT x FROM kept").Scan(&x)
	}()
	select {
	case err := <-answered:
		t.Fatalf("a query was answered while paused: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("after resume: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no answer 30s after resume")
	}
}

// FreePort never hands out a port twice in one process, though each is
// free only until its server binds it: 2,000 draws from its ~22,000
// ports would otherwise meet about 90 times.
func TestFreePortNeverRepeatsAPort(t *testing.T) {
	seen := map[int]bool{}
	for range 2000 {
		p, err := procs.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
