package claimers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
	"github.com/scheduler-dev/scheduler/internal/config"
	"github.com/scheduler-dev/scheduler/migrations"
)

// postgresDriver: a pgx pool on claimer.postgres.dsn.
var postgresDriver = driver{
	open:    openPostgres,
	servers: postgresServers,
	dial:    dialPostgres,
	isolate: isolatePostgres,
}

func openPostgres(ctx context.Context, c config.Claimer, instance string, o Options) (*Backend, error) {
	pc, err := pgxpool.ParseConfig(c.Postgres.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres: claimer.postgres.dsn: %v", config.RedactError(err, c.Postgres.DSN))
	}
	if c.Postgres.Password != "" {
		pc.ConnConfig.Password = string(c.Postgres.Password)
	}
	if f := c.Postgres.PasswordFile; f != "" {
		// Read anew at every connection (config.Rotating); the lease
		// pool's configuration is a copy of this one, hook included.
		password := config.Rotating(f, c.Postgres.Password)
		pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			cc.Password = string(password())
			return nil
		}
	}
	if c.Postgres.MaxConns > 0 {
		pc.MaxConns = int32(c.Postgres.MaxConns)
	}
	postgres.Tune(pc)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	leases, err := pgxpool.NewWithConfig(ctx, postgres.LeasePool(pc))
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	cl := postgres.New(pool, postgres.Options{Instance: instance, Leases: leases})
	b := &Backend{Claimer: cl, Pruner: cl, Controls: cl.Controls(), DB: db, Dialect: migrations.Postgres,
		Lost: cl.Lost(), LostErr: cl.LostErr,
		closers: []func(){pool.Close, leases.Close, func() { _ = db.Close() }}}
	switch {
	case o.Migrate && c.Postgres.Migrate:
		if err := migrations.Up(ctx, db, migrations.Postgres); err != nil {
			_ = b.Close()
			return nil, fmt.Errorf("postgres: migrate up: %w", err)
		}
	case o.Migrate:
		// A replica that leaves migrations to the operator still asks
		// the server before it starts, as one that applies them does:
		// the pool dials lazily, so one started against a server out of
		// reach started anyway and failed every claim, for good, where
		// the other asks again for two leases and exits 1 (an outside
		// review).
		if err := pool.Ping(ctx); err != nil {
			_ = b.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
	}
	return b, nil
}

func postgresServers(c config.Claimer) []string {
	pc, err := pgconn.ParseConfig(c.Postgres.DSN)
	if err != nil || strings.HasPrefix(pc.Host, "/") {
		return nil
	}
	return []string{net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port)))}
}

func dialPostgres(c config.Claimer, addrs []string) (config.Claimer, error) {
	if len(addrs) != 1 {
		return c, fmt.Errorf("postgres dials one server, not %d", len(addrs))
	}
	host, port, err := net.SplitHostPort(addrs[0])
	if err != nil {
		return c, err
	}
	c.Postgres.DSN, err = withParams(c.Postgres.DSN, map[string]string{"host": host, "port": port})
	return c, err
}

// isolatePostgres creates and migrates a schema of its own, which every
// connection of the namespace uses (search_path).
func isolatePostgres(ctx context.Context, c *config.Claimer, name string) (func() error, error) {
	dsn, password := c.Postgres.DSN, string(c.Postgres.Password)
	if err := pgExec(ctx, dsn, password, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("postgres: create schema: %w", err)
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := pgExec(ctx, dsn, password, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			return fmt.Errorf("postgres: schema %s left: %w", name, err)
		}
		return nil
	}
	var err error
	if c.Postgres.DSN, err = withParams(dsn, map[string]string{"search_path": name}); err != nil {
		_ = drop()
		return nil, err
	}
	b, err := openPostgres(ctx, *c, "migrate", Options{})
	if err == nil {
		err = migrations.Up(ctx, b.DB, migrations.Postgres)
		_ = b.Close()
	}
	if err != nil {
		_ = drop()
		return nil, fmt.Errorf("postgres: migrate schema %s: %w", name, err)
	}
	return drop, nil
}

func pgExec(ctx context.Context, dsn, password, sql string) error {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("claimer.postgres.dsn: %v", config.RedactError(err, dsn))
	}
	if password != "" {
		cc.Password = password
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// withParams sets connection parameters on dsn, a URL or key=value
// string (where a later key wins).
func withParams(dsn string, params map[string]string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("claimer.postgres.dsn: not a valid URL")
		}
		q := u.Query()
		for k, v := range params {
			switch k {
			case "host":
				u.Host = net.JoinHostPort(v, cmpPort(u.Port()))
			case "port":
				u.Host = net.JoinHostPort(u.Hostname(), v)
			default:
				q.Set(k, v)
			}
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	for k, v := range params {
		dsn += " " + k + "=" + v
	}
	return dsn, nil
}

func cmpPort(p string) string {
	if p == "" {
		return "5432"
	}
	return p
}
