// Command bench measures the peer libraries a team might use instead of the
// scheduler's claimers, on the same Redis servers and with the same
// operation (obtain a fresh lock, release it): bsm/redislock, redsync on one
// node and on five, and gocron v2's distributed Locker. It is a module of
// its own so that these libraries never become dependencies of the
// scheduler; it measures with the scheduler's internal/benchkit (a nested
// module may import its parent's internal packages: its import path lies
// under theirs), and writes benchkit rows as JSON, which cmd/scheduler-bench
// merges into its table. bench/run.sh runs both.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-co-op/gocron/v2"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/benchkit"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// Reference rows, measured here in turns with the peers and named as
// cmd/scheduler-bench names its own measurement of the same operation, plus
// benchkit.PeerRun: the ratio of a scheduler row to a peer row is taken
// through them.
const (
	refGoRedis  = benchkit.RefGoRedis + benchkit.PeerRun
	refGoRedis5 = benchkit.RefGoRedis5 + benchkit.PeerRun
)

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	nodes := flag.String("redlock", "", "comma-separated addresses of 5 independent nodes for redsync (none: skip)")
	d := flag.Duration("duration", 2*time.Second, "measurement time per row and concurrency")
	concs := flag.String("c", "1,16", "concurrencies")
	out := flag.String("json", "", "write the rows here (default stdout)")
	flag.Parse()
	cs, err := benchkit.ParseConcurrencies(*concs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}

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

	var rows []benchkit.Row
	for _, c := range cs {
		key := func(name string, i int64) string { return fmt.Sprintf("%s%s:c%d:%d", prefix, name, c, i) }
		var (
			group []benchkit.Row
			ops   []benchkit.Op
		)
		add := func(r benchkit.Row, o benchkit.Op) { group, ops = append(group, r), append(ops, o) }
		add(benchkit.Row{Name: refGoRedis, Group: "raw", Op: "SET NX PX + DEL", RoundTrips: 2},
			benchkit.BareLock([]*goredislib.Client{one}, fmt.Sprintf("%sraw:c%d:", prefix, c)))
		add(benchkit.Row{Name: benchkit.PeerRedislock, Group: "peer", Op: "Obtain+Release", RoundTrips: 2, Ref: refGoRedis},
			func(ctx context.Context, i int64) error {
				l, err := locker.Obtain(ctx, key("bsm", i), time.Minute, nil)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			})
		add(benchkit.Row{Name: benchkit.PeerRedsync1, Group: "peer", Op: "Lock+Unlock", RoundTrips: 2, Ref: refGoRedis},
			redsyncOp(rs1, func(i int64) string { return key("rs1", i) }))
		add(benchkit.Row{Name: "gocron v2 Locker (redsync)", Group: "peer", Op: "Lock+Unlock", RoundTrips: 2, Ref: refGoRedis,
			Note: "gocron ships the interface only; adapter as gocron-redis-lock"},
			func(ctx context.Context, i int64) error {
				l, err := gl.Lock(ctx, key("gocron", i))
				if err != nil {
					return err
				}
				return l.Unlock(ctx)
			})
		if len(five) > 0 {
			add(benchkit.Row{Name: refGoRedis5, Group: "raw", Op: "SET NX PX + DEL", RoundTrips: 2},
				benchkit.BareLock(five, fmt.Sprintf("%sraw5:c%d:", prefix, c)))
			add(benchkit.Row{Name: benchkit.PeerRedsync5, Group: "peer", Op: "Lock+Unlock", RoundTrips: 2, Ref: refGoRedis5},
				redsyncOp(rs5, func(i int64) string { return key("rs5", i) }))
		}
		fmt.Fprintf(os.Stderr, "measuring %d peer and reference rows at c=%d\n", len(group), c)
		rows = append(rows, benchkit.Interleave(ctx, c, *d, benchkit.Rounds, group, ops)...)
	}
	for _, c := range append(five, one) {
		_ = redisnode.DropPrefix(ctx, c, prefix)
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
func redsyncOp(rs *redsync.Redsync, key func(int64) string) benchkit.Op {
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
