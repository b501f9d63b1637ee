package etcd

import (
	"fmt"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// lossGuard notices a cluster that lost its data (every member's data
// directory wiped and the cluster started anew, or a restore from an old
// snapshot without a revision bump) and holds every run for a lease after
// it did, as the redis claimer's restart guard does. It notices a member
// that diverged from the others too, as long as it keeps answering
// below what the others did: the explorer found one on etcd 3.4.23 (a
// member SIGKILLed soon after a NOSPACE alarm was disarmed came back at
// the same applied index with 27 to 35 revisions fewer, its HashKV
// apart), and held every run while the replicas kept meeting it. Those
// answers lack writes the others acknowledged, so a grant on them could
// hand a live run to a second holder: held is the safe side.
//
// An etcd revision never goes down, and every response this claimer
// reads is linearizable (writes, lease grants and quorum reads; the one
// serializable read, Reach, is not watched): a response to a request sent
// after another's response came back carries at least that revision. So
// each request notes the highest revision seen when it is sent, and a
// response below it, or from another cluster id, means the cluster forgot
// writes it acknowledged. Requests in flight across a detection are not
// judged (they may come from either side of the loss); their answers are
// refused while the guard holds, like every other. One comparison under a
// mutex per response, no round trip.
type lossGuard struct {
	mu      sync.Mutex
	cluster uint64 // the cluster id of the responses; 0 before the first
	rev     int64  // the highest revision seen since the last loss
	gen     uint64 // losses seen; a request sent before one is not judged
	longest time.Duration
	loss    *claim.DataLossError // the last loss; held until loss.Until
}

// sent is what a request knew when it was sent.
type sent struct {
	rev int64
	gen uint64
}

// send notes a request about to be sent, under lease (0 for one that
// grants nothing): the guard lasts the longest lease this claimer was
// asked for, so that every holder from before a loss has stopped
// trusting its claim when it ends. It returns the loss whose guard still
// holds, if one does.
func (g *lossGuard) send(lease time.Duration) (sent, *claim.DataLossError) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.longest = max(g.longest, lease)
	return sent{rev: g.rev, gen: g.gen}, g.holding()
}

func (g *lossGuard) holding() *claim.DataLossError {
	if g.loss != nil && time.Now().Before(g.loss.Until) {
		return g.loss
	}
	return nil
}

// seen judges the header h of the response to a request sent as s, and
// returns the loss whose guard holds, if one does: found now, or before.
func (g *lossGuard) seen(s sent, h *pb.ResponseHeader, backend func() string) *claim.DataLossError {
	if h == nil {
		return g.current()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if s.gen != g.gen {
		return g.holding()
	}
	switch {
	case g.cluster == 0:
		g.cluster = h.ClusterId
	case h.ClusterId != 0 && h.ClusterId != g.cluster:
		g.lost(backend(), fmt.Sprintf("it answered as cluster %x, not as cluster %x", h.ClusterId, g.cluster), h)
		return g.loss
	}
	if h.Revision < s.rev {
		g.lost(backend(), fmt.Sprintf("its revision went back from %d to %d", s.rev, h.Revision), h)
		return g.loss
	}
	g.rev = max(g.rev, h.Revision)
	return g.holding()
}

func (g *lossGuard) current() *claim.DataLossError {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.holding()
}

// lost starts a guard of the longest lease from now, and takes h's
// cluster and revision as the ones to judge from.
func (g *lossGuard) lost(backend, how string, h *pb.ResponseHeader) {
	lease := max(g.longest, time.Second)
	g.loss = &claim.DataLossError{Backend: backend, Until: time.Now().Add(lease),
		Detail: how + ": it forgot writes it acknowledged, and fences restart lower, " +
			"so storage that checks fences will refuse new holders until they pass the old ones; " +
			"if one member diverged from the others (etcdctl endpoint hashkv --cluster differs), replace that member; " +
			"if the cluster lost its data, restore from a snapshot with etcdutl snapshot restore --bump-revision " +
			"above every fence handed out (see the README's etcd notes)"}
	g.cluster, g.rev, g.gen = h.ClusterId, h.Revision, g.gen+1
}

// backend names the cluster for a DataLossError.
func (c *Claimer) backend() string {
	return "the etcd cluster at " + strings.Join(c.cli.Endpoints(), ",")
}

// seen is c.guard.seen for c.
func (c *Claimer) seen(s sent, h *pb.ResponseHeader) *claim.DataLossError {
	return c.guard.seen(s, h, c.backend)
}
