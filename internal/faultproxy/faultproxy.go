// Package faultproxy is an in-process TCP proxy for tests: it sits between
// clients and one server on loopback and injects the network faults a
// claimer must survive: latency, connection resets, partitions, and requests
// or replies lost together with their connection.
//
// Each accepted connection (a link) gets its own connection to the target
// and four goroutines: per direction, a reader that stamps each chunk it
// reads with the time it is due (now + latency), and a writer that delivers
// chunks in order once due, unless a fault says otherwise. A chunk is what
// one Read returned; faults that look at bytes (DropReplies, DropRequests)
// see one chunk at a time.
//
// Partition semantics: while a partition is on, nothing is delivered. New
// connections are accepted, but the target is not dialled; on existing
// links the bytes read are held (up to a small buffer, then TCP's own flow
// control holds the rest), so clients see silence and time out. When the
// partition lifts, forwarding resumes: held bytes are delivered in order,
// then any close that happened meanwhile, as a healed network would. A
// client that gave up during the partition may thus have its request
// executed late, which is exactly what a claimer must tolerate.
//
// Every control is safe for concurrent use. Close stops the listener,
// resets every link and waits for every goroutine the proxy started.
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Directions, for the byte-matching faults.
const (
	up   = 0 // client → server: requests
	down = 1 // server → client: replies
)

// Proxy forwards connections from Addr to a target address.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu          sync.Mutex
	links       map[*link]struct{}
	latency     time.Duration
	partitioned bool
	heal        chan struct{} // closed when the current partition lifts
	drop        [2]dropRule   // per direction
	closed      bool
	stats       Stats
}

// Stats count what the proxy did, for a test to report when it fails.
type Stats struct {
	Accepted    int           // client connections accepted
	DialErrors  int           // dials of the target that failed
	SlowestDial time.Duration // the longest dial of the target
	Dropped     int           // chunks discarded by DropRequests or DropReplies
}

// dropRule discards the next n chunks that match (nil matches any).
type dropRule struct {
	n     int
	match func([]byte) bool
}

// New starts a proxy to target on 127.0.0.1 at a free port.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the proxy's host:port; point clients here instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, resets every open connection and waits until every
// goroutine of the proxy has exited.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.ResetAll()
	p.wg.Wait()
	return err
}

// SetLatency delays every chunk read from now on, in both directions, by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// ResetAll aborts every open connection with a TCP RST on both sides
// (SO_LINGER 0, then close). Bytes in flight are lost.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.teardown(true)
	}
}

// Partition stops (on) or resumes (off) all forwarding; see the package
// comment for what happens to held bytes.
func (p *Proxy) Partition(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && !p.partitioned:
		p.partitioned, p.heal = true, make(chan struct{})
	case !on && p.partitioned:
		p.partitioned = false
		close(p.heal)
	}
}

// DropReplies swallows the next n server→client chunks for which match
// returns true (nil: any chunk): the server has executed the request, but
// its reply is discarded and the connection reset, so the client sees an
// error for a request that took effect.
func (p *Proxy) DropReplies(n int, match func(reply []byte) bool) { p.setDrop(down, n, match) }

// DropRequests discards the next n client→server chunks for which match
// returns true (nil: any chunk) and resets their connections: the server
// never sees the request.
func (p *Proxy) DropRequests(n int, match func(request []byte) bool) { p.setDrop(up, n, match) }

func (p *Proxy) setDrop(dir, n int, match func([]byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop[dir] = dropRule{n: n, match: match}
}

// Links reports how many client connections are open through the proxy.
func (p *Proxy) Links() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Stats returns what the proxy has done so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// takeDrop reports whether chunk b must be dropped, consuming one drop.
func (p *Proxy) takeDrop(dir int, b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := &p.drop[dir]
	if r.n <= 0 || (r.match != nil && !r.match(b)) {
		return false
	}
	r.n--
	p.stats.Dropped++
	return true
}

// healed returns a channel that is closed once no partition is on.
func (p *Proxy) healed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.partitioned {
		return closedChan
	}
	return p.heal
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		l := &link{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.links[l] = struct{}{}
		p.stats.Accepted++
		p.mu.Unlock()
		p.wg.Go(func() { p.serve(l) })
	}
}

// serve dials the target once no partition holds the link back, then
// forwards both directions until the link is torn down.
func (p *Proxy) serve(l *link) {
	defer func() {
		l.teardown(false)
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	select {
	case <-p.healed():
	case <-l.done:
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	start := time.Now()
	s, err := d.Dial("tcp", p.target)
	p.mu.Lock()
	p.stats.SlowestDial = max(p.stats.SlowestDial, time.Since(start))
	if err != nil {
		p.stats.DialErrors++
	}
	p.mu.Unlock()
	if err != nil {
		return // the client sees its connection closed
	}
	if !l.attach(s) {
		_ = s.Close()
		return
	}
	var dirs sync.WaitGroup
	dirs.Go(func() { p.pipe(l, up, l.client, s) })
	dirs.Go(func() { p.pipe(l, down, s, l.client) })
	dirs.Wait()
}

type chunk struct {
	b   []byte
	due time.Time
}

// pipe forwards src to dst. On src's EOF it half-closes dst after the
// pending chunks; on any other error or a dropped chunk it ends the link.
func (p *Proxy) pipe(l *link, dir int, src, dst net.Conn) {
	ch := make(chan chunk, 16)
	var eof bool
	var reader sync.WaitGroup
	reader.Go(func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				due := time.Now().Add(p.latency)
				p.mu.Unlock()
				select {
				case ch <- chunk{buf[:n], due}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				eof = isEOF(err)
				return
			}
		}
	})
	defer reader.Wait()
	for c := range ch {
		if !l.wait(time.Until(c.due)) {
			l.teardown(true)
			return
		}
		select {
		case <-p.healed():
		case <-l.done:
			return
		}
		if p.takeDrop(dir, c.b) {
			l.teardown(true)
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			l.teardown(true)
			return
		}
	}
	// ch is closed: the reader saw EOF or an error (eof is set before the
	// close, so reading it here is ordered after the write).
	if !eof {
		l.teardown(true)
		return
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// link is one proxied connection: the client's side and, once dialled, the
// server's.
type link struct {
	client net.Conn
	done   chan struct{}

	mu     sync.Mutex
	server net.Conn
	ended  bool
}

// attach records the server side, unless the link already ended.
func (l *link) attach(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.server = s
	return true
}

// wait sleeps d unless the link ends first; it reports whether it slept.
func (l *link) wait(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}

// teardown closes both sides once, with an RST if reset is set.
func (l *link) teardown(reset bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.ended = true
	close(l.done)
	for _, c := range []net.Conn{l.client, l.server} {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); reset && ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}
