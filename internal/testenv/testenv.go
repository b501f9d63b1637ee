// Package testenv finds the real services integration tests run against, in
// the order DESIGN.md fixes: SCHEDULER_TEST_* variables, then local defaults
// when reachable. When neither is there the test skips with one clear line,
// unless SCHEDULER_TEST_REQUIRE_SERVICES=1 (set by .ci/run), which makes a
// missing service a failure. It also starts private redis-server processes
// (alone or as a Redis Cluster) and etcd clusters for tests that must
// restart or kill a node.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
	"github.com/scheduler-dev/scheduler/internal/procs"
)

// Environment variables read by tests (and only by tests).
const (
	EnvPostgresDSN     = "SCHEDULER_TEST_POSTGRES_DSN"
	EnvRedisAddr       = "SCHEDULER_TEST_REDIS_ADDR"
	EnvRedlockAddrs    = "SCHEDULER_TEST_REDLOCK_ADDRS"
	EnvRequireServices = "SCHEDULER_TEST_REQUIRE_SERVICES"
)

const (
	defaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultRedisAddr   = "127.0.0.1:6379"
)

// Required reports whether a missing service must fail the test.
func Required() bool { return os.Getenv(EnvRequireServices) == "1" }

// Missing skips t, or fails it when services are required.
func Missing(t testing.TB, service, why string) {
	t.Helper()
	msg := fmt.Sprintf("%s unavailable (%s); %s", service, why, hintFor(service))
	if Required() {
		t.Fatalf("%s, and %s=1", msg, EnvRequireServices)
	}
	t.Skip(msg)
}

// hintFor says how to provide what is missing: a service by address or
// container, a program by installing it (as .ci/run does).
func hintFor(service string) string {
	env := ""
	switch service {
	case "postgres", "postgres TLS":
		env = EnvPostgresDSN
	case "redis":
		env = EnvRedisAddr
	case "redis-server":
		return fmt.Sprintf("install it (.ci/run does), or set %s to running nodes", EnvRedlockAddrs)
	case "redis cluster":
		return fmt.Sprintf("install redis-server and redis-tools (.ci/run does), or set %s to a running cluster", EnvRedisClusterAddrs)
	case "etcd":
		return fmt.Sprintf("install etcd-server (.ci/run does), or set %s to running members", EnvEtcdEndpoints)
	default:
		return "install it (.ci/run installs what the tests need)"
	}
	return fmt.Sprintf("set %s, start it locally, or run with -tags testcontainers where Docker is available", env)
}

// Container starters, set by containers.go when built with -tags
// testcontainers; nil otherwise.
var startPostgres, startRedis func() (string, error)

// PostgresDSN returns the DSN of a reachable PostgreSQL server.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return find(t, "postgres", os.Getenv(EnvPostgresDSN), "127.0.0.1:5432", defaultPostgresDSN, startPostgres)
}

// RedisAddr returns the address of a reachable Redis server.
func RedisAddr(t testing.TB) string {
	t.Helper()
	return find(t, "redis", os.Getenv(EnvRedisAddr), defaultRedisAddr, defaultRedisAddr, startRedis)
}

// find applies DESIGN.md's order: the variable, the local default when it
// answers, a container when built with testcontainers, else Missing.
func find(t testing.TB, service, fromEnv, localAddr, local string, container func() (string, error)) string {
	t.Helper()
	if fromEnv != "" {
		return fromEnv
	}
	err := dial(localAddr)
	if err == nil {
		return local
	}
	if container != nil {
		got, cerr := container()
		if cerr == nil {
			return got
		}
		err = cerr
	}
	Missing(t, service, err.Error())
	return ""
}

// IgnoreRedisDialProbe is for goleak in tests that make go-redis dial a
// dead node: after repeated dial failures go-redis probes the node from a
// goroutine that checks for Close only between one-second sleeps; it exits
// on its own once the client is closed.
var IgnoreRedisDialProbe = goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")

// RedlockAddrs returns the addresses of independent Redis nodes for Redlock:
// SCHEDULER_TEST_REDLOCK_ADDRS, or n private redis-server processes started
// for this test.
func RedlockAddrs(t testing.TB, n int) []string {
	t.Helper()
	if v := os.Getenv(EnvRedlockAddrs); v != "" {
		return strings.Split(v, ",")
	}
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = StartRedis(t).Addr()
	}
	return addrs
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// Redis is a redis-server process started by a test (internal/procs),
// without persistence unless its extra arguments turn it on; Dir is where
// it keeps an RDB snapshot or an AOF then, which a restart loads. It is
// stopped (by pid) when the test ends.
type Redis struct {
	t testing.TB
	*procs.Redis
}

// StartRedis starts a private redis-server on a free loopback port. Extra
// arguments are passed to redis-server (e.g. "--maxmemory", "1mb").
func StartRedis(t testing.TB, extra ...string) *Redis {
	t.Helper()
	if _, err := procs.RedisBin(""); err != nil {
		Missing(t, "redis-server", "not on PATH")
	}
	s, err := procs.StartRedis(t.Context(), procs.RedisOptions{Dir: t.TempDir(), Args: extra})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &Redis{t: t, Redis: s}
}

// StartPostgres starts a private PostgreSQL cluster (internal/procs) on
// a free loopback port, for a test that crashes, restarts or pauses it;
// it is shut down and removed when the test ends.
func StartPostgres(t testing.TB) *procs.Postgres {
	t.Helper()
	s, err := procs.StartPostgres(t.Context(), procs.PostgresOptions{})
	if procs.IsUnavailable(err) {
		Missing(t, "initdb", err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Start (re)starts the process on the same port: empty, unless extra
// arguments turned persistence on or the test saved a snapshot (SAVE).
func (r *Redis) Start() {
	r.t.Helper()
	if err := r.Redis.Start(context.Background()); err != nil {
		r.t.Fatal(err)
	}
}

// Restart kills the node and starts it again on the same port: empty, unless
// it persists its data (see Start).
func (r *Redis) Restart() {
	r.t.Helper()
	r.Stop()
	r.Start()
}

// RefuseWrites makes the server refuse every write, out of memory
// (maxmemory 1 under noeviction), or take them again (maxmemory 0).
func (r *Redis) RefuseWrites(on bool) {
	r.t.Helper()
	limit := "0"
	if on {
		limit = "1"
	}
	c := goredis.NewClient(&goredis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	ctx, cancel := CleanupContext()
	defer cancel()
	if err := c.ConfigSet(ctx, "maxmemory", limit).Err(); err != nil {
		r.t.Fatal(err)
	}
}

// CleanupContext is for t.Cleanup work: t.Context is already cancelled then.
func CleanupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// shmDir is a RAM-backed file system, where there is one.
const shmDir = "/dev/shm"

// FastDir returns a fresh directory, removed when t ends, on a RAM-backed
// file system (/dev/shm) where the machine has one, else in the system's
// temp directory.
//
// It is for SQLite files in tests whose leases are hundreds of
// milliseconds. SQLite syncs the WAL at every commit, and on a disk that
// other test binaries are writing to, one fsync can wait for seconds: long
// enough to time out every claim of a 1.5s lease while the claimer is
// fine. (A production lease is tens of seconds.) On tmpfs the claimer runs
// exactly the same code and the sync returns at once. Tests of SQLite on a
// real disk keep using t.TempDir().
//
// The directory is open to other accounts, as a temp dir is: a private
// PostgreSQL cluster under it runs as the postgres account.
func FastDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp(shmDir, "scheduler-test-*")
	if err != nil { // no tmpfs here
		if dir, err = os.MkdirTemp("", "scheduler-test-*"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// PostgresSchema creates an empty schema on the test server and returns a
// DSN whose connections use it (search_path). The schema is dropped when t
// ends, so tests can run in parallel and re-run on a dirty database.
func PostgresSchema(t testing.TB) string {
	t.Helper()
	dsn := PostgresDSN(t)
	var b [8]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		Missing(t, "postgres", err.Error())
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := CleanupContext()
		defer cancel()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "search_path=" + schema
}

// RandomPrefix returns a unique Redis key prefix for one test.
func RandomPrefix(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "test:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

// RedisPrefix returns a key prefix unique to t and deletes every key under
// it on each of addrs when t ends, so tests can share a Redis server, run in
// parallel and re-run on a dirty one.
func RedisPrefix(t testing.TB, addrs ...string) string {
	t.Helper()
	prefix := RandomPrefix(t.Name())
	t.Cleanup(func() {
		ctx, cancel := CleanupContext()
		defer cancel()
		for _, addr := range addrs {
			admin := goredis.NewClient(&goredis.Options{Addr: addr})
			if err := redisnode.DropPrefix(ctx, admin, prefix); err != nil {
				t.Errorf("delete keys %s* on %s: %v", prefix, addr, err)
			}
			_ = admin.Close()
		}
	})
	return prefix
}
