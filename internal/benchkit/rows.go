package benchkit

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/sqlite"
)

// Row names that other rows (and the nested bench module) refer to.
const (
	RefMutexMap      = "bare mutex+map"
	RefSQLiteInsert  = "bare database/sql SQLite INSERT"
	RefPgxInsert     = "bare pgx INSERT … ON CONFLICT"
	RefPgbench       = "pgbench INSERT … ON CONFLICT"
	RefGoRedis       = "bare go-redis SET NX PX + Lua DEL"
	RefGoRedis5      = "bare go-redis ×5 SET NX PX + Lua DEL"
	RefRedisBench    = "redis-benchmark SET NX PX"
	RowPostgresClaim = "postgres (claim only)"
	RowRedlock       = "redlock (5 nodes)"
	opCycle          = "claim+release"
)

// Options tune a suite run.
type Options struct {
	// Duration of each measurement (default 2s).
	Duration time.Duration
	// Concurrencies measured for every row (default 1 and 16).
	Concurrencies []int
	// Kinds of claimer to measure (default all five).
	Kinds []string
	// Log receives progress lines; nil is silent.
	Log *slog.Logger
}

func (o *Options) defaults() {
	if o.Duration == 0 {
		o.Duration = 2 * time.Second
	}
	if len(o.Concurrencies) == 0 {
		o.Concurrencies = []int{1, 16}
	}
	if len(o.Kinds) == 0 {
		o.Kinds = []string{"memory", "sqlite", "postgres", "redis", "redlock"}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

var base = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Claimers measures every claimer and its raw references, in turns (see
// Interleave). Rows for a backend that cannot be reached carry the error.
func Claimers(ctx context.Context, s Services, o Options) []Row {
	o.defaults()
	var rows []Row
	for _, kind := range o.Kinds {
		b, err := s.openBackend(ctx, kind)
		if err == nil {
			var c claim.Claimer
			if c, err = b.open("bench"); err == nil {
				rows = append(rows, o.backendRows(ctx, s, kind, b, c)...)
			}
			b.close()
		}
		if err != nil {
			for _, c := range o.Concurrencies {
				rows = append(rows, Row{Name: kind, Group: "claimer", Op: opCycle, Concurrency: c, Error: err.Error()})
			}
		}
	}
	return rows
}

// rounds is how many turns Interleave takes.
const rounds = 5

func (o Options) backendRows(ctx context.Context, s Services, kind string, b *backend, c claim.Claimer) []Row {
	var out []Row
	for _, conc := range o.Concurrencies {
		var (
			rows []Row
			ops  []Op
		)
		add := func(r Row, op Op) { rows, ops = append(rows, r), append(ops, op) }
		switch kind {
		case "memory":
			add(Row{Name: RefMutexMap, Group: "raw", Op: "insert+delete", RoundTrips: 2}, mutexMap())
			add(Row{Name: kind, Group: "claimer", Op: opCycle, RoundTrips: 2, Ref: RefMutexMap}, cycle(c, conc, true))
		case "sqlite":
			op, closeRaw, err := sqliteInsert(ctx, b.path)
			if err != nil {
				out = append(out, Row{Name: RefSQLiteInsert, Group: "raw", Concurrency: conc, Error: err.Error()})
			} else {
				defer closeRaw()
				add(Row{Name: RefSQLiteInsert, Group: "raw", Op: "INSERT", RoundTrips: 1}, op)
			}
			// Statements, not round trips: a claim reads, then upserts; a
			// release updates.
			add(Row{Name: kind, Group: "claimer", Op: opCycle, RoundTrips: 3, Ref: RefSQLiteInsert,
				Note: "round trips = SQL statements"}, cycle(c, conc, true))
		case "postgres":
			out = append(out, pgbench(ctx, s, b, conc, o.Duration))
			op, err := pgxInsert(ctx, b)
			if err != nil {
				out = append(out, Row{Name: RefPgxInsert, Group: "raw", Concurrency: conc, Error: err.Error()})
			} else {
				add(Row{Name: RefPgxInsert, Group: "raw", Op: "INSERT", RoundTrips: 1, Ref: RefPgbench}, op)
			}
			add(Row{Name: RowPostgresClaim, Group: "claimer", Op: "claim", RoundTrips: 1, Ref: RefPgxInsert}, cycle(c, conc, false))
			add(Row{Name: kind, Group: "claimer", Op: opCycle, RoundTrips: 2, Ref: RefPgxInsert}, cycle(c, conc, true))
		case "redis":
			out = append(out, redisBenchmark(ctx, s.RedisAddr, b.prefix, conc, o.Duration))
			add(Row{Name: RefGoRedis, Group: "raw", Op: "SET NX PX + DEL", RoundTrips: 2, Ref: RefRedisBench}, goRedis(b.rdb, b.prefix+"raw:"))
			add(Row{Name: kind, Group: "claimer", Op: opCycle, RoundTrips: 2, Ref: RefGoRedis}, cycle(c, conc, true))
		case "redlock":
			add(Row{Name: RefGoRedis5, Group: "raw", Op: "SET NX PX + DEL", RoundTrips: 2}, goRedis(b.rdb, b.prefix+"raw:"))
			add(Row{Name: RowRedlock, Group: "claimer", Op: opCycle, RoundTrips: 3, Ref: RefGoRedis5,
				Note: "claim, commit and release rounds"}, cycle(c, conc, true))
		}
		for _, r := range rows {
			o.Log.Info("measuring", "row", r.Name, "concurrency", conc)
		}
		out = append(out, Interleave(ctx, conc, o.Duration, rounds, rows, ops)...)
	}
	return out
}

// cycle claims a fresh run and, if release, releases it as succeeded.
func cycle(c claim.Claimer, conc int, release bool) Op {
	job := fmt.Sprintf("bench.c%d.release=%t", conc, release)
	return func(ctx context.Context, i int64) error {
		cl, err := c.Claim(ctx, claim.Run{Job: job, At: base.Add(time.Duration(i) * time.Second)}, time.Minute)
		if err != nil || !release {
			return err
		}
		return c.Release(ctx, cl, claim.Succeeded)
	}
}

func mutexMap() Op {
	var mu sync.Mutex
	m := map[string]string{}
	return func(ctx context.Context, i int64) error {
		id := claim.Run{Job: "raw", At: base.Add(time.Duration(i) * time.Second)}.ID()
		tok := claim.NewToken()
		mu.Lock()
		if _, ok := m[id]; !ok {
			m[id] = tok
		}
		mu.Unlock()
		mu.Lock()
		if m[id] == tok {
			delete(m, id)
		}
		mu.Unlock()
		return nil
	}
}

// sqliteInsert opens a second handle on the claimer's file with one
// connection (SQLite has one writer) and inserts into a scratch table.
func sqliteInsert(ctx context.Context, path string) (Op, func(), error) {
	db, err := sql.Open("sqlite", sqlite.DSN(path))
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(1)
	_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS bench_raw (run_id TEXT PRIMARY KEY, job TEXT NOT NULL,
  scheduled_at INTEGER NOT NULL, status TEXT NOT NULL, token TEXT NOT NULL, holder TEXT NOT NULL,
  fence INTEGER NOT NULL, attempt INTEGER NOT NULL, started_at INTEGER NOT NULL, lease_until INTEGER NOT NULL)`)
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	st, err := db.PrepareContext(ctx, `INSERT INTO bench_raw VALUES (?1, 'job.bench', ?2, 'running', ?3, 'bench', 1, 1,
  CAST(unixepoch('subsec') * 1000 AS INTEGER), CAST(unixepoch('subsec') * 1000 AS INTEGER) + 60000)
ON CONFLICT (run_id) DO NOTHING RETURNING fence`)
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	// The table is per concurrency level: a fresh id space each time.
	gen := time.Now().UnixNano()
	return func(ctx context.Context, i int64) error {
			at := base.Add(time.Duration(i) * time.Second)
			var fence int64
			return st.QueryRowContext(ctx, fmt.Sprintf("%d:%s", gen, claim.Run{Job: "raw", At: at}.ID()), at.UnixMilli(),
				claim.NewToken()).Scan(&fence)
		}, func() {
			_ = st.Close()
			_ = db.Close()
		}, nil
}

const pgxInsertSQL = `
INSERT INTO bench_raw (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
VALUES ($1, 'job.bench', $2, 'running', $3, 'bench', 1, 1, now(), now() + interval '1 minute')
ON CONFLICT (run_id) DO NOTHING RETURNING fence`

// pgxInsert inserts one row per operation into a table shaped like
// scheduler_runs (same columns, same indexes) with the bare pool.
func pgxInsert(ctx context.Context, b *backend) (Op, error) {
	if _, err := b.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_raw (LIKE scheduler_runs INCLUDING ALL)`); err != nil {
		return nil, err
	}
	gen := time.Now().UnixNano()
	return func(ctx context.Context, i int64) error {
		at := base.Add(time.Duration(i) * time.Second)
		var fence int64
		return b.pool.QueryRow(ctx, pgxInsertSQL, fmt.Sprintf("%d:%s", gen, claim.Run{Job: "raw", At: at}.ID()), at,
			claim.NewToken()).Scan(&fence)
	}, nil
}

// unlockScript is the classic compare-and-delete.
var unlockScript = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// goRedis is the bare lock on one node or, with several, the same on all
// of them in parallel (each round waits for every node).
func goRedis(nodes []*goredis.Client, prefix string) Op {
	gen := time.Now().UnixNano()
	each := func(f func(c *goredis.Client) error) error {
		if len(nodes) == 1 {
			return f(nodes[0])
		}
		errs := make([]error, len(nodes))
		var wg sync.WaitGroup
		for i, c := range nodes {
			wg.Go(func() { errs[i] = f(c) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	return func(ctx context.Context, i int64) error {
		key := fmt.Sprintf("%s%d:%d", prefix, gen, i)
		tok := claim.NewToken()
		if err := each(func(c *goredis.Client) error {
			err := c.Do(ctx, "SET", key, tok, "NX", "PX", 60000).Err()
			if err == goredis.Nil {
				err = fmt.Errorf("key %s already set", key)
			}
			return err
		}); err != nil {
			return err
		}
		return each(func(c *goredis.Client) error { return unlockScript.Run(ctx, c, []string{key}, tok).Err() })
	}
}
