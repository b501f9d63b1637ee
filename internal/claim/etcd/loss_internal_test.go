package etcd

import (
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestLossGuardJudgesByWhatARequestKnew: answers to requests in flight
// together may come back in any order, so only an answer below what was
// seen before its request was sent is a loss; one from another cluster
// is too; a request sent before a loss is not judged, yet refused.
func TestLossGuardJudgesByWhatARequestKnew(t *testing.T) {
	var g lossGuard
	name := func() string { return "the cluster" }
	h := func(cluster uint64, rev int64) *pb.ResponseHeader {
		return &pb.ResponseHeader{ClusterId: cluster, Revision: rev}
	}
	a, _ := g.send(time.Minute)
	b, _ := g.send(time.Second)
	if l := g.seen(b, h(7, 100), name); l != nil {
		t.Fatalf("first answer: %v", l)
	}
	if l := g.seen(a, h(7, 90), name); l != nil {
		t.Fatalf("an answer sent before a higher one came back is no loss: %v", l)
	}
	c, _ := g.send(0)
	if l := g.seen(c, h(7, 100), name); l != nil {
		t.Fatalf("the same revision again: %v", l)
	}
	stale, _ := g.send(0) // in flight across the loss
	d, _ := g.send(0)
	before := time.Now()
	l := g.seen(d, h(7, 3), name)
	if l == nil {
		t.Fatal("an answer below what its request knew is a loss")
	}
	if l.Until.Before(before.Add(time.Minute)) || l.Until.After(time.Now().Add(time.Minute)) {
		t.Fatalf("held until %s, want the longest lease (1m) after detection", l.Until)
	}
	if got := g.seen(stale, h(7, 150), name); got != l {
		t.Fatalf("an answer to a request sent before the loss: %v, want the same loss, held", got)
	}
	if _, held := g.send(time.Second); held != l {
		t.Fatalf("a request during the guard: %v, want the loss", held)
	}
	e, _ := g.send(0)
	if got := g.seen(e, h(7, 4), name); got != l {
		t.Fatalf("the new cluster's next answer: %v, want the same loss, not another", got)
	}
	// A guard that has passed holds nothing; another cluster id is a loss.
	g.loss.Until = time.Now().Add(-time.Millisecond)
	f, held := g.send(0)
	if held != nil {
		t.Fatalf("after the guard: %v", held)
	}
	if got := g.seen(f, h(7, 5), name); got != nil {
		t.Fatalf("after the guard: %v", got)
	}
	f, _ = g.send(0)
	if got := g.seen(f, h(8, 500), name); got == nil || got == l {
		t.Fatalf("an answer from another cluster: %v, want a new loss", got)
	}
}
