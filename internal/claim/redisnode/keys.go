package redisnode

import (
	"hash/fnv"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Buckets is how many hash tags the Redis Cluster layout spreads jobs
// over: every key of one job carries its bucket's tag, so that each script
// touches one slot, and the keys that span jobs (the jobs set, the restart
// marker) are one per bucket. It is part of the layout: changing it, or
// the hash, moves every job to other keys.
const Buckets = 256

// keys builds the key layout, and is the one place that knows it. A single
// server (and every Redlock node) keeps the layout it always had:
//
//	<prefix>run:<run id>  <prefix>fence:<job>  <prefix>runs:<job>
//	<prefix>jobs          <prefix>server       <prefix>controls
//	<prefix>ready (Ping's write probe, a minute's life)
//
// On a Redis Cluster (tagged) the same names follow a hash tag of the
// job's bucket, <prefix>{<bucket>}run:<run id> and so on, and the jobs set,
// the marker and the probe are one per bucket. The controls hash is one key either
// way: its scripts touch nothing else. Run ids are injective
// (claim.Run.ID), and the namespaces differ before the variable part
// ("run:" vs "runs:"), so distinct runs and jobs never share a key.
type keys struct {
	prefix string
	tagged bool
}

// tagged reports whether client needs the cluster layout: it is a
// *goredis.ClusterClient, or the caller says so (force).
func tagged(client goredis.UniversalClient, force bool) bool {
	_, cluster := client.(*goredis.ClusterClient)
	return cluster || force
}

// count is how many buckets the layout has: 1 untagged.
func (k keys) count() int {
	if k.tagged {
		return Buckets
	}
	return 1
}

// bucket is job's bucket: 0 untagged, else FNV-1a of the name modulo
// Buckets.
func (k keys) bucket(job string) int {
	if !k.tagged {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(job))
	return int(h.Sum32() % Buckets)
}

// in is how every key of bucket b starts.
func (k keys) in(b int) string {
	if !k.tagged {
		return k.prefix
	}
	return k.prefix + "{" + strconv.Itoa(b) + "}"
}

// run is the hash of the run with id (claim.Run.ID: the job, "@", the
// instant, which holds no "@").
func (k keys) run(id string) string { return k.in(k.bucket(jobOf(id))) + "run:" + id }

func (k keys) fence(job string) string { return k.in(k.bucket(job)) + "fence:" + job }
func (k keys) runs(job string) string  { return k.in(k.bucket(job)) + "runs:" + job }
func (k keys) jobs(b int) string       { return k.in(b) + "jobs" }
func (k keys) marker(b int) string     { return k.in(b) + "server" }
func (k keys) controls() string        { return k.prefix + "controls" }
func (k keys) ready(b int) string      { return k.in(b) + "ready" } // Ping's write

// jobOf is the job of the run with id (see run).
func jobOf(id string) string {
	if i := strings.LastIndexByte(id, '@'); i >= 0 {
		return id[:i]
	}
	return id
}
