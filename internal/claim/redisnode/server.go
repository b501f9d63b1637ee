package redisnode

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Ping reports whether the server takes writes, which is what a claim
// needs; on a cluster, whether the master of every bucket does. A PING
// alone answers PONG from a server that refuses every claim: out of
// memory (OOM), demoted to a replica (READONLY), short of in-sync replicas
// (NOREPLICAS), after a failed snapshot (MISCONF). So it writes a short-
// lived key per bucket instead (<prefix>ready), which those refuse too.
// Then it checks what Open checked (Check): a maxmemory-policy set to
// evict since then is a server that cannot keep a claim.
func (n *Node) Ping(ctx context.Context) error {
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	if n.keys.count() == 1 {
		// One command, not a pipeline: go-redis retries a pipeline that
		// cannot dial for longer, and a server that is down must be
		// reported down within a readiness probe's time.
		if err := n.client.Set(ctx, n.keys.ready(0), now, time.Minute).Err(); err != nil {
			return n.translate(ctx, err)
		}
		return n.Check(ctx)
	}
	_, err := n.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for b := range n.keys.count() {
			p.Set(ctx, n.keys.ready(b), now, time.Minute)
		}
		return nil
	})
	if err != nil {
		return n.translate(ctx, err)
	}
	return n.Check(ctx)
}

// Check refuses what cannot keep a claim:
//   - a server that may evict keys: with maxmemory set and any
//     maxmemory-policy but noeviction, Redis may drop a claim under memory
//     pressure and the run would execute twice;
//   - a Redis Cluster node behind a plain client, which would answer most
//     claims with a redirection (MOVED) instead of running them;
//   - on a cluster, a prefix holding a brace, which would move the hash
//     tag of every key off its bucket.
//
// On a cluster it checks every master holding one of the namespace's
// buckets. It reads INFO, which managed services that disable CONFIG
// still serve.
func (n *Node) Check(ctx context.Context) error {
	if n.keys.tagged && strings.ContainsAny(n.keys.prefix, "{}") {
		return fmt.Errorf("redis: key prefix %q holds a brace: on a Redis Cluster the claimer tags every key "+
			"with its bucket ({n}), and a brace in the prefix would become the hash tag instead", n.keys.prefix)
	}
	if n.cluster == nil {
		_, err := n.checkServer(ctx, n.client, n.addr)
		return err
	}
	// The masters that hold the namespace's buckets, from the client's
	// slot map as it stands (reloaded in the background, and at once on
	// a redirection). go-redis's ForEachMaster reloads the map first from
	// a random node, and one that was paused (a replica with no slots,
	// even) held the whole check: readiness read 503 on some probes
	// while claims ran on time (an outside review).
	masters := map[string]*goredis.Client{}
	for b := range n.keys.count() {
		c, err := n.cluster.MasterForKey(ctx, n.keys.ready(b))
		if err != nil {
			// The slot map could not be read: no seed answers, or a seed
			// is a server with cluster support disabled, which is said
			// with the setting to change.
			if strings.Contains(err.Error(), "cluster support disabled") {
				return fmt.Errorf("redis cluster at %s: the server is not a Redis Cluster node (%w): "+
					"talk to it as a single server (claimer.redis.cluster: false)", n.addr, err)
			}
			return fmt.Errorf("redis cluster at %s: %w", n.addr, n.translate(ctx, err))
		}
		masters[c.Options().Addr] = c
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		found []error
	)
	for addr, c := range masters {
		wg.Go(func() {
			if _, err := n.checkServer(ctx, c, addr); err != nil {
				mu.Lock()
				found = append(found, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(found...)
}

// CheckID is Check on a single server (a Redlock node), which also
// returns the server's run_id, read in the same INFO: a process has one
// for its lifetime, and no two processes share one, so two nodes that
// report the same run_id are one server under two addresses.
func (n *Node) CheckID(ctx context.Context) (string, error) {
	if n.cluster != nil {
		return "", fmt.Errorf("redis: CheckID on a cluster client (%s)", n.addr)
	}
	return n.checkServer(ctx, n.client, n.addr)
}

// checkServer runs Check's test on one server (a master of a cluster)
// and returns its run_id.
func (n *Node) checkServer(ctx context.Context, c goredis.UniversalClient, addr string) (string, error) {
	info, err := c.Info(ctx).Result() // the default sections hold server, memory and cluster
	if err != nil {
		return "", n.translate(ctx, err)
	}
	var maxmemory int64
	policy, cluster, id := "", false, ""
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "maxmemory":
			maxmemory, _ = strconv.ParseInt(v, 10, 64)
		case "maxmemory_policy":
			policy = v
		case "cluster_enabled":
			cluster = v == "1"
		case "run_id":
			id = v
		}
	}
	at := ""
	if addr != "" {
		at = " at " + addr
	}
	if cluster && !n.keys.tagged {
		return "", fmt.Errorf("redis: the server%s is a Redis Cluster node (cluster_enabled:1), and this client "+
			"talks to it as a single server: it would be redirected (MOVED) on most claims; connect as a "+
			"cluster client instead (claimer.redis.cluster: true); Redlock nodes must be independent servers", at)
	}
	if maxmemory > 0 && policy != "noeviction" && !n.allowEviction {
		return "", fmt.Errorf("redis: maxmemory%s is %d bytes with maxmemory-policy %q: %w "+
			"and let a run execute twice; set maxmemory-policy noeviction (or maxmemory 0), or allow eviction "+
			"explicitly to accept that risk", at, maxmemory, policy, ErrMayEvict)
	}
	return id, nil
}

// translate is the package's translate, and on a cluster, when a node did
// not answer, it asks the client to reload its slot map (in the
// background, at most every 200ms): a master that died is replaced by
// its promoted replica there, and the next calls go to it.
func (n *Node) translate(ctx context.Context, err error) error {
	out := translate(ctx, err)
	// Unanswered: the server unavailable, or the caller gone before it
	// replied (a merged batch's callers cancel rather than time out).
	var reply goredis.Error
	if errors.Is(out, claim.ErrUnavailable) || out != nil && ctx.Err() != nil && !errors.As(err, &reply) {
		n.unanswered.Note()
	}
	if n.cluster != nil && out != nil && (errors.Is(out, claim.ErrUnavailable) || ctx.Err() != nil) {
		n.cluster.ReloadState(ctx)
	}
	return out
}

// translate maps a go-redis error onto the claim contract, in one place.
// The caller's cancellation comes back unchanged, never as a sentinel;
// anything that says the server cannot serve us now (no connection, a
// timeout, LOADING, READONLY, OOM, auth, a cluster that is down or
// moving a slot) is claim.ErrUnavailable; other server replies are bugs
// and are returned as they are. go-redis errors carry addresses, never
// passwords.
func translate(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		// Whatever the client saw (a deadline on the socket, a dropped
		// connection) followed from the caller giving up.
		return ctx.Err()
	case errors.Is(err, goredis.Nil):
		// No script replies nil and no command used here returns it.
		return fmt.Errorf("redis: unexpected nil reply")
	case errors.Is(err, goredis.ErrClosed):
		// Kept, so that a watcher can tell a closed client from a server
		// that is down.
		return fmt.Errorf("%w: %w", claim.ErrUnavailable, err)
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) && !serverUnavailable(err) {
		return err
	}
	// %v, not %w: a timeout inside the client is not the caller's deadline.
	return fmt.Errorf("%w: %v", claim.ErrUnavailable, err)
}

func serverUnavailable(err error) bool {
	return goredis.IsLoadingError(err) || goredis.IsReadOnlyError(err) || goredis.IsMasterDownError(err) ||
		goredis.IsClusterDownError(err) || goredis.IsTryAgainError(err) || goredis.IsMaxClientsError(err) ||
		goredis.IsOOMError(err) || goredis.IsAuthError(err) || goredis.IsPermissionError(err) ||
		goredis.HasErrorPrefix(err, "BUSY") ||
		// Refusing writes for now: too few replicas in sync
		// (min-replicas-to-write), or the last snapshot failed
		// (stop-writes-on-bgsave-error).
		goredis.HasErrorPrefix(err, "NOREPLICAS") || goredis.HasErrorPrefix(err, "MISCONF")
}
