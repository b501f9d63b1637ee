package procs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// RedisClusterOptions configure StartRedisCluster.
type RedisClusterOptions struct {
	// Bin is the redis-server binary and Cli redis-cli; "": on PATH.
	Bin, Cli string
	// Dir holds one working directory per node (its nodes.conf); "": a
	// fresh temporary directory, removed by Close.
	Dir string
	// Masters (default 3) and Replicas per master shape the cluster;
	// with Masters unset, there is at least 1 replica per master.
	Masters, Replicas int
	// NodeTimeout is cluster-node-timeout: how long a master may stay
	// silent before its replica is promoted (default 1s).
	NodeTimeout time.Duration
	// Args are passed to every node after the launcher's own.
	Args []string
}

// RedisCluster is a Redis Cluster of redis-server processes on free
// loopback ports, created with redis-cli --cluster create: the first
// Masters nodes serve the slots, each of the others replicates one of
// them. Nodes keep no data on disk (a killed node comes back empty, with
// its nodes.conf), and a replica is promoted whatever its lag
// (cluster-replica-validity-factor 0), so a kill always fails over. Its
// methods are not safe for concurrent use.
type RedisCluster struct {
	dir    string
	ownDir bool
	nodes  []*Redis
}

// RedisCliBin finds redis-cli: bin when set, else on PATH. Its error is
// Unavailable when there is none.
func RedisCliBin(bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	p, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", &Unavailable{"no redis-cli on PATH"}
	}
	return p, nil
}

// StartRedisCluster starts the nodes, creates the cluster and waits until
// every node reports it ok and every replica is in sync with its master.
func StartRedisCluster(ctx context.Context, o RedisClusterOptions) (*RedisCluster, error) {
	bin, err := RedisBin(o.Bin)
	if err != nil {
		return nil, err
	}
	cli, err := RedisCliBin(o.Cli)
	if err != nil {
		return nil, err
	}
	masters, replicas := o.Masters, max(o.Replicas, 0)
	if masters <= 0 {
		masters, replicas = 3, max(replicas, 1)
	}
	timeout := o.NodeTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	c := &RedisCluster{dir: o.Dir}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "scheduler-redis-cluster-*"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	args := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
		"--cluster-replica-validity-factor", "0",
		// A replica syncs at once instead of waiting 5s for others to join.
		"--repl-diskless-sync-delay", "0"}, o.Args...)
	for i := range masters * (1 + replicas) {
		dir := filepath.Join(c.dir, fmt.Sprintf("n%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			c.Close()
			return nil, err
		}
		// The bus port, by default the port plus 10000, is chosen like
		// the port: below the ephemeral range, so that a restarted node
		// finds it free (see FreePort).
		bus, err := FreePort()
		if err != nil {
			c.Close()
			return nil, err
		}
		n, err := StartRedis(ctx, RedisOptions{Bin: bin, Dir: dir, Args: append(slices.Clone(args), "--cluster-port", strconv.Itoa(bus))})
		if err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	create := append(append([]string{"--cluster", "create"}, c.Addrs()...),
		"--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(cctx, cli, create...).CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %w (%s)", err, lastLines(out, 5))
	}
	if err := c.Await(cctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Nodes are the cluster's nodes, masters first as created (a failover
// changes who is master; see Role).
func (c *RedisCluster) Nodes() []*Redis { return c.nodes }

// Addrs are the nodes' addresses, in the order of Nodes.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// Node is the node at addr, or nil.
func (c *RedisCluster) Node(addr string) *Redis {
	for _, n := range c.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Close stops every node and removes the directory if StartRedisCluster
// made it.
func (c *RedisCluster) Close() {
	for _, n := range c.nodes {
		n.Stop()
	}
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
	}
}

// Await waits until every running node reports cluster_state:ok and knows
// every node, and every running replica's link to its master is up: after
// a start, or after a master was killed, once its replica has taken over.
func (c *RedisCluster) Await(ctx context.Context) error {
	var last error
	for {
		if last = c.healthy(ctx); last == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("redis cluster %s not ok: %w (%v)", strings.Join(c.Addrs(), ","), ctx.Err(), last)
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

// healthy is one look at every running node for Await.
func (c *RedisCluster) healthy(ctx context.Context) error {
	for _, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		err := func() error {
			cl := goredis.NewClient(&goredis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second,
				ReadTimeout: time.Second, DisableIdentity: true})
			defer cl.Close()
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			f := fields(info)
			if f["cluster_state"] != "ok" || f["cluster_known_nodes"] != strconv.Itoa(len(c.nodes)) {
				return fmt.Errorf("cluster_state %s, %s nodes known", f["cluster_state"], f["cluster_known_nodes"])
			}
			repl, err := cl.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if r := fields(repl); r["role"] == "slave" && r["master_link_status"] != "up" {
				return errors.New("replica's link to its master is down")
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
	}
	return nil
}

// Role is what the node at addr says it is: "master" or "slave".
func (c *RedisCluster) Role(ctx context.Context, addr string) (string, error) {
	cl := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true})
	defer cl.Close()
	repl, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	return fields(repl)["role"], nil
}

// ReplicasOf lists the addresses of the replicas the master at addr
// feeds.
func (c *RedisCluster) ReplicasOf(ctx context.Context, addr string) ([]string, error) {
	cl := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true})
	defer cl.Close()
	repl, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for k, v := range fields(repl) {
		if !strings.HasPrefix(k, "slave") || k == "slave_read_repl_offset" {
			continue
		}
		var ip, port string
		for kv := range strings.SplitSeq(v, ",") {
			switch name, val, _ := strings.Cut(kv, "="); name {
			case "ip":
				ip = val
			case "port":
				port = val
			}
		}
		if ip != "" && port != "" {
			out = append(out, ip+":"+port)
		}
	}
	return out, nil
}

// fields reads "key:value" lines (INFO, CLUSTER INFO).
func fields(info string) map[string]string {
	out := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
}
