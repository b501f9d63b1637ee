package redisnode

import (
	"sync"
	"time"
)

// serverClocks estimates, for each server incarnation (run_id) this node's
// claims reached, how far the server's clock reads ahead of this
// process's monotonic one: the least difference between a claim script's
// TIME and the call's send, over the last window or two. A call sent at
// s cannot run before s plus that; one the server ran well after it
// waited in the server, stopped or busy, and a takeover it grants can
// land ahead of a holder's release that waited there too (the residual
// of claim.Unanswered: a standby whose bid went into a stall before any
// of its calls went unanswered). The claim script holds such a takeover
// back (claimBody's ARGV[8]).
//
// The least difference is the true one plus the quickest call's delay,
// so calls that waited do not raise it. A server whose clock steps
// forward holds takeovers back until the step leaves the window (two
// windows at most); one that steps back only loosens the check as long.
type serverClocks struct {
	mu sync.Mutex
	by map[string]*clockOffset
}

// clockOffset is one server's least difference, over the current window
// and the one before it.
type clockOffset struct {
	cur, prev int64 // ms; prev valid once a window has passed
	since     int64 // the current window's start, local ms
	rotated   bool
}

// clockWindow is how long a least difference is kept for.
const clockWindow = 20 * time.Second

// localMS is this process's monotonic clock, in ms.
func localMS() int64 { return time.Since(localEpoch).Milliseconds() }

var localEpoch = time.Now()

// observe records that server id's script read serverMS for a call sent
// at sent (localMS).
func (c *serverClocks) observe(id string, sent, serverMS int64) {
	if id == "" {
		return
	}
	d, now := serverMS-sent, localMS()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil || len(c.by) > 64 { // incarnations pile up only across restarts
		c.by = map[string]*clockOffset{}
	}
	o := c.by[id]
	switch {
	case o == nil:
		c.by[id] = &clockOffset{cur: d, since: now}
	case now-o.since > clockWindow.Milliseconds():
		o.prev, o.cur, o.since, o.rotated = o.cur, d, now, true
	default:
		o.cur = min(o.cur, d)
	}
}

// latest is the latest time on server id's clock at which a call sent at
// sent (localMS) has waited no longer than wait; ok is false if nothing
// is known of that server yet.
func (c *serverClocks) latest(id string, sent int64, wait time.Duration) (by int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.by[id]
	if o == nil {
		return 0, false
	}
	d := o.cur
	if o.rotated {
		d = min(d, o.prev)
	}
	return sent + d + wait.Milliseconds(), true
}
