package benchkit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/claim/redisnode"
)

// redisBenchmark runs redis-benchmark with SET key NX PX on random keys
// under prefix and reads its --csv line. A short calibration run sizes the
// real one to last about d. It deletes its keys (hundreds of thousands)
// afterwards.
func redisBenchmark(ctx context.Context, addr, prefix string, conc int, d time.Duration) Row {
	row := Row{Name: RefRedisBench, Group: "raw", Op: "SET NX PX", Concurrency: conc, RoundTrips: 1}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	prefix += "rb:"
	defer func() {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		_ = redisnode.DropPrefix(context.WithoutCancel(ctx), c, prefix)
		_ = c.Close()
	}()
	run := func(n int) ([]string, time.Duration, error) {
		start := time.Now()
		out, err := exec.CommandContext(ctx, "redis-benchmark", "-h", host, "-p", port, "-c", strconv.Itoa(conc),
			"-n", strconv.Itoa(n), "-r", "1000000000", "--csv",
			"SET", prefix+"__rand_int__", "v", "NX", "PX", "60000").Output()
		if err != nil {
			return nil, 0, fmt.Errorf("redis-benchmark: %w", err)
		}
		recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
		if err != nil || len(recs) < 2 || len(recs[1]) < 7 {
			return nil, 0, fmt.Errorf("redis-benchmark: unexpected --csv output %q", out)
		}
		return recs[1], time.Since(start), nil
	}
	rec, _, err := run(2000)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	rps, _ := strconv.ParseFloat(rec[1], 64)
	n := max(int(rps*d.Seconds()), 1000)
	rec, took, err := run(n)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	// Columns: test, rps, avg, min, p50, p95, p99, max (ms).
	row.Ops, row.Seconds = int64(n), took.Seconds()
	row.OpsPerSec, _ = strconv.ParseFloat(rec[1], 64)
	p50, _ := strconv.ParseFloat(rec[4], 64)
	p99, _ := strconv.ParseFloat(rec[6], 64)
	row.P50us, row.P99us = p50*1000, p99*1000
	return row
}

// pgbench runs a custom script, the same INSERT … ON CONFLICT DO NOTHING
// RETURNING as the pgx reference, into a scratch table in the backend's
// scratch schema, and reads tps and per-transaction latencies from its log.
func pgbench(ctx context.Context, n *namespace, b *claimers.Backend, conc int, d time.Duration) Row {
	row := Row{Name: RefPgbench, Group: "raw", Op: "INSERT", Concurrency: conc, RoundTrips: 1}
	fail := func(err error) Row { row.Error = err.Error(); return row }
	table := pgx.Identifier{n.name, "bench_pgbench"}.Sanitize()
	if _, err := b.DB.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (LIKE scheduler_runs INCLUDING ALL)`); err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp(n.s.Dir, "pgbench-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "insert.sql")
	body := fmt.Sprintf(`\set id random(1, 9000000000000000000)
INSERT INTO %s (run_id, job, scheduled_at, status, token, holder, fence, attempt, started_at, lease_until)
VALUES ('%d:' || :id::text, 'job.bench', now(), 'running', md5(:id::text), 'bench', 1, 1, now(), now() + interval '1 minute')
ON CONFLICT (run_id, scheduled_at) DO NOTHING RETURNING fence;
`, table, conc)
	if err := os.WriteFile(script, []byte(body), 0o600); err != nil {
		return fail(err)
	}
	secs := max(int(d.Round(time.Second)/time.Second), 1)
	cmd := exec.CommandContext(ctx, "pgbench", "-n", "-M", "prepared", "-f", script, "-c", strconv.Itoa(conc),
		"-j", strconv.Itoa(min(conc, 2)), "-T", strconv.Itoa(secs), "-l", "--log-prefix", filepath.Join(dir, "log"),
		pgURL(n.s.PostgresDSN))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("pgbench: %w: %s", err, lastLines(out, 3)))
	}
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil {
		return fail(fmt.Errorf("pgbench: no tps in output: %s", lastLines(out, 5)))
	}
	row.OpsPerSec, _ = strconv.ParseFloat(string(m[1]), 64)
	row.Seconds = float64(secs)
	// Per-transaction log lines: client_id tx_no latency_us script_no epoch us.
	logs, _ := filepath.Glob(filepath.Join(dir, "log.*"))
	var lat []time.Duration
	for _, f := range logs {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			if fs := strings.Fields(sc.Text()); len(fs) >= 3 {
				if us, err := strconv.ParseInt(fs[2], 10, 64); err == nil {
					lat = append(lat, time.Duration(us)*time.Microsecond)
				}
			}
		}
		fh.Close()
	}
	row.Ops = int64(len(lat))
	row.P50us, row.P99us = Percentile(lat, 0.5), Percentile(lat, 0.99)
	return row
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], " | ")
}

// pgURL is dsn without a search_path, for pgbench (libpq takes a URI).
func pgURL(dsn string) string {
	if i := strings.Index(dsn, "search_path="); i >= 0 {
		return strings.TrimRight(dsn[:i], "?&")
	}
	return dsn
}
