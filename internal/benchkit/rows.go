package benchkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/config"
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

// ParseConcurrencies parses a comma-separated list of concurrencies.
func ParseConcurrencies(list string) ([]int, error) { return ParseCounts("concurrency", list) }

// ParseCounts parses a comma-separated list of positive numbers of what.
func ParseCounts(what, list string) ([]int, error) {
	var cs []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad %s %q", what, f)
		}
		cs = append(cs, n)
	}
	return cs, nil
}

var base = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Claimers measures every claimer and its raw references, in turns (see
// Interleave). Rows for a backend that cannot be reached carry the error.
func Claimers(ctx context.Context, s Services, o Options) []Row {
	o.defaults()
	var rows []Row
	for _, kind := range o.Kinds {
		got, err := o.kindRows(ctx, s, kind)
		rows = append(rows, got...)
		if err != nil {
			for _, c := range o.Concurrencies {
				rows = append(rows, Row{Name: kind, Group: "claimer", Op: opCycle, Concurrency: c, Error: err.Error()})
			}
		}
	}
	return rows
}

// Rounds is how many turns Interleave takes in a suite run.
const Rounds = 5

// reference is what benchkit measures of one claimer kind besides opening
// it (which is claimers'): its rows and the raw references they are
// compared with, on the claimer's own namespace.
type reference struct {
	// claimer rows: Op opCycle claims and releases, "claim" only claims.
	claimer []Row
	// raw is the raw reference measured in turns with the claimer, fresh
	// for each concurrency; done, if not nil, closes it.
	raw func(ctx context.Context, n *namespace, b *claimers.Backend) (r Row, op Op, done func(), err error)
	// whole measures a tool that runs whole, just before the turns.
	whole func(ctx context.Context, n *namespace, b *claimers.Backend, conc int, d time.Duration) Row
}

// references holds each kind's rows.
var references = map[string]reference{
	config.ClaimerMemory: {
		claimer: []Row{{Name: "memory", Op: opCycle, RoundTrips: 2, Ref: RefMutexMap}},
		raw: func(context.Context, *namespace, *claimers.Backend) (Row, Op, func(), error) {
			return Row{Name: RefMutexMap, Op: "insert+delete", RoundTrips: 2}, mutexMap(), nil, nil
		},
	},
	// Statements, not round trips: a claim reads, then upserts; a release
	// updates.
	config.ClaimerSQLite: {
		claimer: []Row{{Name: "sqlite", Op: opCycle, RoundTrips: 3, Ref: RefSQLiteInsert, Note: "round trips = SQL statements"}},
		raw:     sqliteInsert,
	},
	config.ClaimerPostgres: {
		claimer: []Row{{Name: RowPostgresClaim, Op: "claim", RoundTrips: 1, Ref: RefPgxInsert},
			{Name: "postgres", Op: opCycle, RoundTrips: 2, Ref: RefPgxInsert}},
		raw:   pgxInsert,
		whole: pgbench,
	},
	config.ClaimerRedis: {
		claimer: []Row{{Name: "redis", Op: opCycle, RoundTrips: 2, Ref: RefGoRedis}},
		raw: func(_ context.Context, n *namespace, _ *claimers.Backend) (Row, Op, func(), error) {
			op, done := dialBareLock(n.Servers(), n.Config.Redis.Prefix+"raw:")
			return Row{Name: RefGoRedis, Op: "SET NX PX + DEL", RoundTrips: 2, Ref: RefRedisBench}, op, done, nil
		},
		whole: func(ctx context.Context, n *namespace, _ *claimers.Backend, conc int, d time.Duration) Row {
			return redisBenchmark(ctx, n.Config.Redis.Addr, n.Config.Redis.Prefix, conc, d)
		},
	},
	config.ClaimerRedlock: {
		claimer: []Row{{Name: RowRedlock, Op: opCycle, RoundTrips: 3, Ref: RefGoRedis5, Note: "claim, commit and release rounds"}},
		raw: func(_ context.Context, n *namespace, _ *claimers.Backend) (Row, Op, func(), error) {
			op, done := dialBareLock(n.Servers(), n.Config.Redlock.Prefix+"raw:")
			return Row{Name: RefGoRedis5, Op: "SET NX PX + DEL", RoundTrips: 2}, op, done, nil
		},
	},
}

// kindRows measures kind's claimer and its references on a namespace of
// their own.
func (o Options) kindRows(ctx context.Context, s Services, kind string) ([]Row, error) {
	n, err := s.isolate(ctx, kind)
	if err != nil {
		return nil, err
	}
	defer n.close()
	b, err := n.open(ctx, "bench")
	if err != nil {
		return nil, err
	}
	ref, ok := references[kind]
	if !ok { // a kind benchkit has no references for: its claimer alone
		ref.claimer = []Row{{Name: kind, Op: opCycle, RoundTrips: 2}}
	}
	var out []Row
	for _, conc := range o.Concurrencies {
		var (
			rows []Row
			ops  []Op
		)
		if ref.whole != nil {
			out = append(out, ref.whole(ctx, n, b, conc, o.Duration))
		}
		if ref.raw != nil {
			r, op, done, err := ref.raw(ctx, n, b)
			r.Group = "raw"
			if err != nil {
				r.Concurrency, r.Error = conc, err.Error()
				out = append(out, r)
			} else {
				if done != nil {
					defer done()
				}
				rows, ops = append(rows, r), append(ops, op)
			}
		}
		for _, r := range ref.claimer {
			r.Group = "claimer"
			rows, ops = append(rows, r), append(ops, cycle(b, conc, r.Op == opCycle))
			if r.Op == opCycle {
				// The runner claims and releases in batches: what one
				// backend can take at scale (docs/scale.md).
				rows = append(rows, Row{Name: r.Name + batchSuffix, Group: "claimer", Op: fmt.Sprintf("%s ×%d", opCycle, batchRuns),
					RoundTrips: r.RoundTrips, PerOp: batchRuns, Note: "ops/s are runs"})
				ops = append(ops, batchCycle(b, conc))
			}
		}
		for _, r := range rows {
			o.Log.Info("measuring", "row", r.Name, "concurrency", conc)
		}
		for _, r := range Interleave(ctx, conc, o.Duration, Rounds, rows, ops) {
			if r.PerOp > 1 {
				r.Ops *= int64(r.PerOp)
				r.OpsPerSec *= float64(r.PerOp)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// A batch row claims batchRuns fresh runs in one call and releases them
// in one call; its name is the claimer row's plus batchSuffix.
const (
	batchRuns   = 100
	batchSuffix = " (batches of 100)"
)

// batchCycle claims batchRuns fresh runs in one call, then releases them
// as succeeded in one call.
func batchCycle(c claim.Claimer, conc int) Op {
	job := fmt.Sprintf("bench.batch.c%d", conc)
	return func(ctx context.Context, i int64) error {
		runs := make([]claim.Run, batchRuns)
		for k := range runs {
			runs[k] = claim.Run{Job: job, At: base.Add(time.Duration(i*batchRuns+int64(k)) * time.Second)}
		}
		cls, errs := c.Claim(ctx, runs, time.Minute)
		outs := make([]claim.Status, len(cls))
		for k, err := range errs {
			if err != nil {
				return err
			}
			outs[k] = claim.Succeeded
		}
		return errors.Join(c.Release(ctx, cls, outs)...)
	}
}

// cycle claims a fresh run and, if release, releases it as succeeded.
func cycle(c claim.Claimer, conc int, release bool) Op {
	job := fmt.Sprintf("bench.c%d.release=%t", conc, release)
	return func(ctx context.Context, i int64) error {
		cl, err := claim.ClaimOne(ctx, c, claim.Run{Job: job, At: base.Add(time.Duration(i) * time.Second)}, time.Minute)
		if err != nil || !release {
			return err
		}
		return claim.ReleaseOne(ctx, c, cl, claim.Succeeded)
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

// sqliteInsert inserts into a scratch table of the claimer's file through
// the backend's own database/sql handle, held to one connection (SQLite
// has one writer).
func sqliteInsert(ctx context.Context, _ *namespace, b *claimers.Backend) (Row, Op, func(), error) {
	row := Row{Name: RefSQLiteInsert, Op: "INSERT", RoundTrips: 1}
	b.DB.SetMaxOpenConns(1)
	_, err := b.DB.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS bench_raw (run_id TEXT PRIMARY KEY, job TEXT NOT NULL,
  scheduled_at INTEGER NOT NULL, status TEXT NOT NULL, token TEXT NOT NULL, holder TEXT NOT NULL,
  fence INTEGER NOT NULL, attempt INTEGER NOT NULL, started_at INTEGER NOT NULL, lease_until INTEGER NOT NULL)`)
	if err != nil {
		return row, nil, nil, err
	}
	st, err := b.DB.PrepareContext(ctx, `INSERT INTO bench_raw VALUES (?1, 'job.bench', ?2, 'running', ?3, 'bench', 1, 1,
  CAST(unixepoch('subsec') * 1000 AS INTEGER), CAST(unixepoch('subsec') * 1000 AS INTEGER) + 60000)
ON CONFLICT (run_id) DO NOTHING RETURNING fence`)
	if err != nil {
		return row, nil, nil, err
	}
	// The table is per concurrency level: a fresh id space each time.
	gen := time.Now().UnixNano()
	return row, func(ctx context.Context, i int64) error {
		at := base.Add(time.Duration(i) * time.Second)
		var fence int64
		return st.QueryRowContext(ctx, fmt.Sprintf("%d:%s", gen, claim.Run{Job: "raw", At: at}.ID()), at.UnixMilli(),
			claim.NewToken()).Scan(&fence)
	}, func() { _ = st.Close() }, nil
}

const pgxInsertSQL = `
INSERT INTO bench_raw (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
VALUES ($1, 'job.bench', $2, 'running', $3, 'bench', 1, 1, now(), now() + interval '1 minute')
ON CONFLICT (run_id, scheduled_at) DO NOTHING RETURNING fence`

// pgxInsert inserts one row per operation into a table shaped like
// scheduler_runs (same columns, same indexes and key) with a bare pool of
// its own on the claimer's schema. LIKE makes it one plain table, not
// partitioned by month as scheduler_runs is: the floor, without the
// routing of a row to its partition.
func pgxInsert(ctx context.Context, n *namespace, _ *claimers.Backend) (Row, Op, func(), error) {
	row := Row{Name: RefPgxInsert, Op: "INSERT", RoundTrips: 1, Ref: RefPgbench}
	pool, err := pgxpool.New(ctx, n.Config.Postgres.DSN)
	if err != nil {
		return row, nil, nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_raw (LIKE scheduler_runs INCLUDING ALL)`); err != nil {
		pool.Close()
		return row, nil, nil, err
	}
	gen := time.Now().UnixNano()
	return row, func(ctx context.Context, i int64) error {
		at := base.Add(time.Duration(i) * time.Second)
		var fence int64
		return pool.QueryRow(ctx, pgxInsertSQL, fmt.Sprintf("%d:%s", gen, claim.Run{Job: "raw", At: at}.ID()), at,
			claim.NewToken()).Scan(&fence)
	}, pool.Close, nil
}

// unlockScript is the classic compare-and-delete.
var unlockScript = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// dialBareLock is BareLock on clients of its own, one per address; done
// closes them.
func dialBareLock(addrs []string, prefix string) (op Op, done func()) {
	nodes := make([]*goredis.Client, len(addrs))
	for i, a := range addrs {
		nodes[i] = goredis.NewClient(&goredis.Options{Addr: a, PoolSize: 64})
	}
	return BareLock(nodes, prefix), func() {
		for _, c := range nodes {
			_ = c.Close()
		}
	}
}

// BareLock is the bare lock the redis claimers are compared with: SET NX
// PX of a fresh key under prefix, then the compare-and-delete script, on
// one node or, with several, on all of them in parallel (each round waits
// for every node). The nested bench module measures it too.
func BareLock(nodes []*goredis.Client, prefix string) Op {
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
