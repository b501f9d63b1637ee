package postgres_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// pool opens a pool on the namespace's DSN, adjusted by tune, closed when
// t ends.
func pool(t *testing.T, dsn string, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	postgres.Tune(cfg)
	if tune != nil {
		tune(cfg)
	}
	p, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestNoClaimWithoutALeasePool: a server out of connections for the pool
// opened second (renewals, releases) let a replica win runs it could not
// renew or release, and each ran again once its lease ended. Claims are
// now refused, unavailable, naming the lease pool, and readiness says so.
func TestNoClaimWithoutALeasePool(t *testing.T) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	dsn := ns.Config.Postgres.DSN
	// A port nobody listens on, for the lease pool alone.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().(*net.TCPAddr)
	_ = ln.Close()
	leases := pool(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.Host, c.ConnConfig.Port = dead.IP.String(), uint16(dead.Port) })
	c := postgres.New(pool(t, dsn, nil), postgres.Options{Instance: "cut-off", Leases: leases})
	t.Cleanup(func() { _ = c.Close() })

	run := claim.Run{Job: "job.leasepool", At: time.Date(2026, 5, 6, 7, 8, 0, 0, time.UTC)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = claim.ClaimOne(ctx, c, run, time.Minute)
	if !errors.Is(err, claim.ErrUnavailable) || !strings.Contains(err.Error(), "lease pool") {
		t.Fatalf("claim with the lease pool unable to connect: %v, want ErrUnavailable naming the lease pool", err)
	}
	if err := c.Ping(ctx); err == nil || !strings.Contains(err.Error(), "lease pool") {
		t.Fatalf("ping with the lease pool unable to connect: %v, want an error naming it", err)
	}
	// Nothing was granted: another replica gets the run.
	if _, err := claim.ClaimOne(ctx, ns.Open("other"), run, time.Minute); err != nil {
		t.Fatalf("claim by another replica: %v", err)
	}
}

// TestAReadOnlyConnectionIsNotKept: connections keep a read-only setting
// for their life (a database set read-only then reset, a primary demoted
// behind the same address): claims kept failing for as long as pgxpool
// kept them (an hour). The first refusal now closes the pools' connections,
// and the next claim, on a new one, is granted. Readiness refuses a
// read-only connection too, which a ping did not.
func TestAReadOnlyConnectionIsNotKept(t *testing.T) {
	ns := backends.Prepare(t, "postgres", backends.Options{})
	dsn := ns.Config.Postgres.DSN
	var readOnly atomic.Bool
	readOnly.Store(true)
	sticky := func(c *pgxpool.Config) {
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			if readOnly.Load() {
				_, err := conn.Exec(ctx, "SET default_transaction_read_only = on")
				return err
			}
			return nil
		}
	}
	c := postgres.New(pool(t, dsn, sticky), postgres.Options{Instance: "ro", Leases: pool(t, dsn, sticky)})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	if err := c.Ping(ctx); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("ping on a read-only connection: %v, want ErrUnavailable", err)
	}
	run := claim.Run{Job: "job.readonly", At: time.Date(2026, 5, 6, 7, 8, 0, 0, time.UTC)}
	if _, err := claim.ClaimOne(ctx, c, run, time.Minute); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("claim on a read-only connection: %v, want ErrUnavailable", err)
	}
	readOnly.Store(false) // the setting is reset; connections made before keep it
	if _, err := claim.ClaimOne(ctx, c, run, time.Minute); err != nil {
		t.Fatalf("claim after the setting was reset: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping after the setting was reset: %v", err)
	}
}
