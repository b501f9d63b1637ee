package benchkit

import (
	"context"
	"os"

	"github.com/scheduler-dev/scheduler/internal/procs"
)

// Nodes are private redis-server processes without persistence, for the
// Redlock rows when no nodes are given.
type Nodes struct {
	Addrs   []string
	servers []*procs.Redis
}

// StartRedisNodes starts n redis-server processes on free loopback ports,
// each in a directory of its own under dir.
func StartRedisNodes(n int, dir string) (*Nodes, error) {
	ns := &Nodes{}
	for range n {
		d, err := os.MkdirTemp(dir, "redis-")
		if err != nil {
			ns.Stop()
			return nil, err
		}
		s, err := procs.StartRedis(context.Background(), procs.RedisOptions{Dir: d})
		if err != nil {
			ns.Stop()
			return nil, err
		}
		ns.servers = append(ns.servers, s)
		ns.Addrs = append(ns.Addrs, s.Addr())
	}
	return ns, nil
}

// Stop kills every node it started and waits for it.
func (ns *Nodes) Stop() {
	for _, s := range ns.servers {
		s.Close()
	}
	ns.servers = nil
}
