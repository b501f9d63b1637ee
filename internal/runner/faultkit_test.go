package runner_test

// The fault kit: one replica of a scenario (the faulty one) reaches its
// backend through fault proxies (network claimers) or through a wrapper that
// injects the same failures at the Claimer interface (sqlite, memory); the
// other replicas reach it directly.

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/claimers"
	"github.com/scheduler-dev/scheduler/internal/faultproxy"
	"github.com/scheduler-dev/scheduler/internal/testenv/backends"
)

// phase is the kind of Claimer call a fault targets. The faulty replica
// makes each kind of call through its own client (and proxies), so that a
// fault armed on one phase hits only those calls: a claim is plain data, and
// any client of the backend can renew or release it.
type phase int

const (
	phClaim phase = iota
	phRenew
	phRelease
	phases
)

func (p phase) String() string { return [...]string{"claim", "renew", "release"}[p] }

// injector injects faults into the faulty replica's view of the backend.
type injector interface {
	SetLatency(d time.Duration)
	Partition(on bool)
	// DropRequests loses the next n requests of phase ph (and their
	// connections): the backend never sees them.
	DropRequests(ph phase, n int)
	// DropReplies loses the replies to the next n requests of phase ph
	// (and their connections) after the backend executed them. With only,
	// just the replies that say the call did what it asked: a claim that
	// granted a fresh run (postgres: the INSERT; redis and redlock: any
	// grant), a release that released; not, say, a connection's handshake.
	DropReplies(ph phase, n int, only bool)
	// Dropped is how many requests and replies were lost so far: a
	// scenario that drops some and dropped none tested nothing.
	Dropped() int
}

// phased routes each kind of call to its own claimer.
type phased [phases]claim.Claimer

func (p phased) Claim(ctx context.Context, runs []claim.Run, l time.Duration) ([]*claim.Claim, []error) {
	return p[phClaim].Claim(ctx, runs, l)
}
func (p phased) Renew(ctx context.Context, c *claim.Claim, l time.Duration) error {
	return p[phRenew].Renew(ctx, c, l)
}
func (p phased) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	return p[phRelease].Release(ctx, cls, outs)
}
func (p phased) History(ctx context.Context, job string, limit int) ([]claim.Record, error) {
	return p[phClaim].History(ctx, job, limit)
}
func (p phased) Ping(ctx context.Context) error { return p[phClaim].Ping(ctx) }
func (p phased) Close() error {
	for _, c := range p {
		_ = c.Close()
	}
	return nil
}

// proxies injects faults through faultproxy: px[phase] holds the phase's
// proxies, one per proxied server.
type proxies struct {
	px [phases][]*faultproxy.Proxy
	// success recognises, per phase, a reply saying the call took effect.
	success [phases]func(reply []byte) bool
}

func (p *proxies) each(f func(*faultproxy.Proxy)) {
	for _, ps := range p.px {
		for _, x := range ps {
			f(x)
		}
	}
}
func (p *proxies) SetLatency(d time.Duration) { p.each(func(x *faultproxy.Proxy) { x.SetLatency(d) }) }
func (p *proxies) Partition(on bool)          { p.each(func(x *faultproxy.Proxy) { x.Partition(on) }) }
func (p *proxies) DropRequests(ph phase, n int) {
	for _, x := range p.px[ph] {
		x.DropRequests(n, nil)
	}
}
func (p *proxies) DropReplies(ph phase, n int, only bool) {
	var match func([]byte) bool
	if only {
		match = p.success[ph]
	}
	for _, x := range p.px[ph] {
		x.DropReplies(n, match)
	}
}

func (p *proxies) Dropped() int {
	n := 0
	p.each(func(x *faultproxy.Proxy) { n += x.Stats().Dropped })
	return n
}

// String reports each phase's proxies' stats, for a failed scenario.
func (p *proxies) String() string {
	var b bytes.Buffer
	for ph, ps := range p.px {
		for _, x := range ps {
			fmt.Fprintf(&b, "%s proxy: %+v\n", phase(ph), x.Stats())
		}
	}
	return b.String()
}

// proxy starts a fault proxy to target for phase ph and returns its address.
func (p *proxies) proxy(t *testing.T, ph phase, target string) string {
	t.Helper()
	x, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	p.px[ph] = append(p.px[ph], x)
	return x.Addr()
}

// wrapped injects the same faults at the Claimer interface, for claimers
// without a network. A partition holds calls until their ctx ends and never
// delivers them (unlike the proxy, which delivers held bytes on heal).
type wrapped struct {
	claim.Claimer
	mu          sync.Mutex
	latency     time.Duration
	partitioned bool
	heal        chan struct{}
	dropReq     [phases]int
	dropRep     [phases]int
	only        bool
	dropped     int
}

var errInjected = fmt.Errorf("%w: injected connection reset", claim.ErrUnavailable)

func (w *wrapped) SetLatency(d time.Duration) { w.mu.Lock(); w.latency = d; w.mu.Unlock() }
func (w *wrapped) Partition(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case on && !w.partitioned:
		w.partitioned, w.heal = true, make(chan struct{})
	case !on && w.partitioned:
		w.partitioned = false
		close(w.heal)
	}
}
func (w *wrapped) DropRequests(ph phase, n int) { w.mu.Lock(); w.dropReq[ph] = n; w.mu.Unlock() }
func (w *wrapped) DropReplies(ph phase, n int, only bool) {
	w.mu.Lock()
	w.dropRep[ph], w.only = n, only
	w.mu.Unlock()
}

func (w *wrapped) take(counts *[phases]int, ph phase) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if counts[ph] > 0 {
		counts[ph]--
		w.dropped++
		return true
	}
	return false
}

func (w *wrapped) Dropped() int { w.mu.Lock(); defer w.mu.Unlock(); return w.dropped }

// send is the way there: latency, a partition, a lost request.
func (w *wrapped) send(ctx context.Context, ph phase) error {
	if err := w.delay(ctx); err != nil {
		return err
	}
	w.mu.Lock()
	heal := w.heal
	if !w.partitioned {
		heal = nil
	}
	w.mu.Unlock()
	if heal != nil {
		select {
		case <-heal:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if w.take(&w.dropReq, ph) {
		return errInjected
	}
	return nil
}

// receive is the way back: a lost reply, latency.
func (w *wrapped) receive(ctx context.Context, ph phase, ok bool) error {
	w.mu.Lock()
	only := w.only
	w.mu.Unlock()
	if (ok || !only) && w.take(&w.dropRep, ph) {
		return errInjected
	}
	return w.delay(ctx)
}

func (w *wrapped) delay(ctx context.Context) error {
	w.mu.Lock()
	d := w.latency
	w.mu.Unlock()
	if d <= 0 {
		return nil
	}
	return sleepCtx(ctx, d)
}

func (w *wrapped) Claim(ctx context.Context, runs []claim.Run, l time.Duration) ([]*claim.Claim, []error) {
	return claim.EachRun(runs, func(r claim.Run) (*claim.Claim, error) {
		if err := w.send(ctx, phClaim); err != nil {
			return nil, err
		}
		cl, err := claim.ClaimOne(ctx, w.Claimer, r, l)
		if rerr := w.receive(ctx, phClaim, err == nil && cl.Attempt == 1); rerr != nil {
			return nil, rerr
		}
		return cl, err
	})
}

func (w *wrapped) Renew(ctx context.Context, c *claim.Claim, l time.Duration) error {
	if err := w.send(ctx, phRenew); err != nil {
		return err
	}
	// Renew updates c's lease fields in place: work on a copy so that a
	// lost reply leaves them as they were, and copy back only those (the
	// runner reads the others concurrently).
	cp := *c
	err := w.Claimer.Renew(ctx, &cp, l)
	if rerr := w.receive(ctx, phRenew, err == nil); rerr != nil {
		return rerr
	}
	if err == nil {
		c.Deadline, c.Requested, c.Lease = cp.Deadline, cp.Requested, cp.Lease
	}
	return err
}

func (w *wrapped) Release(ctx context.Context, cls []*claim.Claim, outs []claim.Status) []error {
	return claim.EachClaim(cls, outs, func(c *claim.Claim, o claim.Status) error {
		if err := w.send(ctx, phRelease); err != nil {
			return err
		}
		err := claim.ReleaseOne(ctx, w.Claimer, c, o)
		if rerr := w.receive(ctx, phRelease, err == nil); rerr != nil {
			return rerr
		}
		return err
	})
}

// faultyBackend is one scenario's backend: healthy opens a direct claimer,
// faulty is the faulty replica's claimer and inject its faults.
type faultyBackend struct {
	healthy func(instance string) *claimers.Backend
	faulty  claim.Claimer
	inject  injector
}

// openFaulty prepares kind's backend for one scenario. For redlock,
// redlockNodes are the nodes and proxied is how many of them the faulty
// replica reaches through proxies (the others directly); a backend of one
// server is always reached through its proxy, one without a network
// through a wrapper.
func openFaulty(t *testing.T, kind, faulty string, redlockNodes []string, proxied int) faultyBackend {
	t.Helper()
	var opts backends.Options
	if kind == "redlock" {
		opts.Servers = redlockNodes
	}
	be := backends.Prepare(t, kind, opts)
	servers := be.Servers()
	switch {
	case len(servers) == 0:
		w := &wrapped{Claimer: be.Open(faulty)}
		return faultyBackend{healthy: be.Open, faulty: w, inject: w}
	case len(servers) == 1:
		proxied = 1
	}
	px := &proxies{}
	// Small postgres pools: every scenario runs at once against one server.
	healthy := func(i string) *claimers.Backend { return be.OpenClient(i, backends.Client{MaxConns: 2}) }
	var ph phased
	for p := range phases {
		via := map[string]string{}
		for _, s := range servers[:proxied] {
			via[s] = px.proxy(t, p, s)
		}
		conns := 1 // one renewal or release at a time is plenty
		if p == phClaim {
			conns = 2
		}
		ph[p] = be.OpenClient(faulty, backends.Client{Via: via, MaxConns: conns})
	}
	if kind == "postgres" {
		// A fresh grant's reply is a row of four columns whose first,
		// the fence, is set (eight bytes, binary; a bid that found the
		// run's row has it NULL), a release's carries the UPDATE's
		// command tag.
		px.success[phClaim] = contains("\x00\x04\x00\x00\x00\x08")
		px.success[phRelease] = contains("UPDATE 1")
	} else {
		px.success[phClaim], px.success[phRelease] = contains("granted"), contains("released")
	}
	return faultyBackend{healthy: healthy, faulty: ph, inject: px}
}

func contains(s string) func([]byte) bool {
	return func(b []byte) bool { return bytes.Contains(b, []byte(s)) }
}
