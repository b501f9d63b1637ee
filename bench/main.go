// Command bench measures the peer libraries a team might use instead of the
// scheduler's claimers, on the same Redis servers and with the same
// operation (obtain a fresh lock, release it): bsm/redislock, redsync on one
// node and on five, and gocron v2's distributed Locker. It is a module of
// its own so that these libraries never become dependencies of the
// scheduler. It writes JSON rows that cmd/scheduler-bench merges into its
// table; bench/run.sh runs both.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-co-op/gocron/v2"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"
)

// Row is the JSON shape of cmd/scheduler-bench's rows (internal/benchkit.Row).
type Row struct {
	Name        string  `json:"name"`
	Group       string  `json:"group"`
	Op          string  `json:"op"`
	Concurrency int     `json:"concurrency"`
	Ops         int64   `json:"ops"`
	Seconds     float64 `json:"seconds"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	RoundTrips  int     `json:"round_trips"`
	Ref         string  `json:"ref,omitempty"`
	Error       string  `json:"error,omitempty"`
	Note        string  `json:"note,omitempty"`
}

// Reference rows, measured here in turns with the peers and named as
// cmd/scheduler-bench names its own measurement of them, plus " (bench/)":
// the ratio of a scheduler row to a peer row is taken through them.
const (
	refGoRedis  = "bare go-redis SET NX PX + Lua DEL (bench/)"
	refGoRedis5 = "bare go-redis ×5 SET NX PX + Lua DEL (bench/)"
)

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	nodes := flag.String("redlock", "", "comma-separated addresses of 5 independent nodes for redsync (none: skip)")
	d := flag.Duration("duration", 2*time.Second, "measurement time per row and concurrency")
	concs := flag.String("c", "1,16", "concurrencies")
	out := flag.String("json", "", "write the rows here (default stdout)")
	flag.Parse()

	ctx := context.Background()
	prefix := fmt.Sprintf("bench:peers:%d:", time.Now().UnixNano())
	one := goredislib.NewClient(&goredislib.Options{Addr: *redisAddr, PoolSize: 64})
	defer one.Close()
	var five []*goredislib.Client
	if *nodes != "" {
		for _, a := range strings.Split(*nodes, ",") {
			c := goredislib.NewClient(&goredislib.Options{Addr: a, PoolSize: 64})
			defer c.Close()
			five = append(five, c)
		}
	}

	locker := redislock.New(one)
	rs1 := redsync.New(goredis.NewPool(one))
	var pools []redis.Pool
	for _, c := range five {
		pools = append(pools, goredis.NewPool(c))
	}
	rs5 := redsync.New(pools...)
	gl := &gocronLocker{rs: rs1}
	var _ gocron.Locker = gl

	var rows []Row
	for _, c := range parseConcs(*concs) {
		key := func(name string, i int64) string { return fmt.Sprintf("%s%s:c%d:%d", prefix, name, c, i) }
		var (
			group []Row
			ops   []op
		)
		add := func(r Row, o op) { group, ops = append(group, r), append(ops, o) }
		add(Row{Name: refGoRedis, Group: "raw", Op: "SET NX PX + DEL", RoundTrips: 2}, bare([]*goredislib.Client{one}, func(i int64) string { return key("raw", i) }))
		add(Row{Name: "bsm/redislock", Group: "peer", Op: "Obtain+Release", RoundTrips: 2, Ref: refGoRedis},
			func(ctx context.Context, i int64) error {
				l, err := locker.Obtain(ctx, key("bsm", i), time.Minute, nil)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			})
		add(Row{Name: "redsync (1 node)", Group: "peer", Op: "Lock+Unlock", RoundTrips: 2, Ref: refGoRedis},
			redsyncOp(rs1, func(i int64) string { return key("rs1", i) }))
		add(Row{Name: "gocron v2 Locker (redsync)", Group: "peer", Op: "Lock+Unlock", RoundTrips: 2, Ref: refGoRedis,
			Note: "gocron ships the interface only; adapter as gocron-redis-lock"},
			func(ctx context.Context, i int64) error {
				l, err := gl.Lock(ctx, key("gocron", i))
				if err != nil {
					return err
				}
				return l.Unlock(ctx)
			})
		if len(five) > 0 {
			add(Row{Name: refGoRedis5, Group: "raw", Op: "SET NX PX + DEL", RoundTrips: 2}, bare(five, func(i int64) string { return key("raw5", i) }))
			add(Row{Name: "redsync (5 nodes)", Group: "peer", Op: "Lock+Unlock", RoundTrips: 2, Ref: refGoRedis5},
				redsyncOp(rs5, func(i int64) string { return key("rs5", i) }))
		}
		fmt.Fprintf(os.Stderr, "measuring %d peer and reference rows at c=%d\n", len(group), c)
		rows = append(rows, interleave(ctx, c, *d, 5, group, ops)...)
	}
	for _, c := range append(five, one) {
		drop(ctx, c, prefix)
	}

	w := os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer f.Close()
		w = f
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rows); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// redsyncOp locks and unlocks a fresh mutex, failing at once if it is
// taken (Tries 1): the peer of one Claim call.
func redsyncOp(rs *redsync.Redsync, key func(int64) string) func(context.Context, int64) error {
	return func(ctx context.Context, i int64) error {
		m := rs.NewMutex(key(i), redsync.WithExpiry(time.Minute), redsync.WithTries(1))
		if err := m.LockContext(ctx); err != nil {
			return err
		}
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: unlock refused")
		}
		return err
	}
}

// gocronLocker is gocron v2's distributed Locker over redsync, as the
// gocron-redis-lock module implements it (that module is not fetchable
// here; it is a few lines).
type gocronLocker struct{ rs *redsync.Redsync }

func (l *gocronLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	m := l.rs.NewMutex(key, redsync.WithExpiry(time.Minute), redsync.WithTries(1))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return gocronLock{m}, nil
}

type gocronLock struct{ m *redsync.Mutex }

func (l gocronLock) Unlock(ctx context.Context) error {
	_, err := l.m.UnlockContext(ctx)
	return err
}

func parseConcs(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscan(f, &n); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

type op = func(context.Context, int64) error

// unlockScript is the classic compare-and-delete.
var unlockScript = goredislib.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// bare is the reference lock: SET NX PX, then the compare-and-delete
// script, on every node in parallel. Same as internal/benchkit's.
func bare(nodes []*goredislib.Client, key func(int64) string) op {
	each := func(f func(c *goredislib.Client) error) error {
		errs := make([]error, len(nodes))
		if len(nodes) == 1 {
			return f(nodes[0])
		}
		var wg sync.WaitGroup
		for i, c := range nodes {
			wg.Go(func() { errs[i] = f(c) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	return func(ctx context.Context, i int64) error {
		k, tok := key(i), fmt.Sprintf("tok-%d-%d", i, time.Now().UnixNano())
		if err := each(func(c *goredislib.Client) error {
			err := c.Do(ctx, "SET", k, tok, "NX", "PX", 60000).Err()
			if err == goredislib.Nil {
				err = fmt.Errorf("key %s already set", k)
			}
			return err
		}); err != nil {
			return err
		}
		return each(func(c *goredislib.Client) error { return unlockScript.Run(ctx, c, []string{k}, tok).Err() })
	}
}

// interleave is internal/benchkit.Interleave: after a d/10 warm-up of
// each, rounds turns in which each op runs from conc goroutines for
// d/rounds; throughput and nearest-rank percentiles over the turns.
func interleave(ctx context.Context, conc int, d time.Duration, rounds int, rows []Row, ops []op) []Row {
	ms := make([]*meter, len(ops))
	for i, o := range ops {
		ms[i] = &meter{op: o, conc: conc}
		ms[i].run(ctx, d/10, false)
	}
	for range rounds {
		for _, m := range ms {
			if m.err == nil {
				m.run(ctx, d/time.Duration(rounds), true)
			}
		}
	}
	for i := range rows {
		m, row := ms[i], &rows[i]
		row.Concurrency = conc
		if m.err != nil {
			row.Error = m.err.Error()
			continue
		}
		slices.Sort(m.lat)
		pct := func(q float64) float64 {
			if len(m.lat) == 0 {
				return 0
			}
			i := min(max(int(q*float64(len(m.lat))+0.5)-1, 0), len(m.lat)-1)
			return float64(m.lat[i]) / float64(time.Microsecond)
		}
		row.Ops, row.Seconds = int64(len(m.lat)), m.took.Seconds()
		row.OpsPerSec = float64(len(m.lat)) / m.took.Seconds()
		row.P50us, row.P99us = pct(0.5), pct(0.99)
	}
	return rows
}

type meter struct {
	op   op
	conc int
	seq  atomic.Int64
	lat  []time.Duration
	took time.Duration
	err  error
}

func (m *meter) run(ctx context.Context, d time.Duration, keep bool) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for range m.conc {
		wg.Go(func() {
			var lat []time.Duration
			for time.Now().Before(end) {
				t := time.Now()
				if err := m.op(ctx, m.seq.Add(1)); err != nil {
					mu.Lock()
					m.err = cmpErr(m.err, err)
					mu.Unlock()
					break
				}
				lat = append(lat, time.Since(t))
			}
			if keep {
				mu.Lock()
				m.lat = append(m.lat, lat...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if keep {
		m.took += time.Since(start)
	}
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func drop(ctx context.Context, c *goredislib.Client, prefix string) {
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Unlink(ctx, iter.Val())
	}
}
