package claim

import (
	"strconv"
	"strings"
	"sync"
	"time"
)

// Bids gives the claim tokens of the Redis-protocol claimers (redis,
// redlock) and remembers, per run, a bid whose claim may have been granted
// unseen: the script ran, the reply was lost (a timeout, a reset, a
// stalled server), and the undo that followed may have been lost too. A
// token is a bid's name and a try number, "<bid>-<n>"; the claim script
// grants a later try of the same bid the live grant an earlier try left,
// in place of answering "held" for a lease nobody will run. It moves the
// grant to the new token, so the earlier try's undo, if it lands late,
// finds another token and undoes nothing.
//
// The zero value is ready to use.
type Bids struct {
	mu   sync.Mutex
	open map[string]openBid // by run ID
	scan time.Time          // the next sweep of stale entries
}

type openBid struct {
	name  string
	try   int
	until time.Time // after which any grant the bid left has expired
}

// Token returns the token for a claim of run: the next try of the bid
// Open last remembered for it, if that bid's grant may still be live, or
// the first try of a new bid. The bid is forgotten: a claim that fails
// again is remembered again.
func (b *Bids) Token(run Run) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := run.ID()
	if o, ok := b.open[id]; ok {
		delete(b.open, id)
		if time.Now().Before(o.until) {
			return o.name + "-" + strconv.Itoa(o.try+1)
		}
	}
	return NewToken() + "-1"
}

// Open remembers token's bid for run, until the time after which any
// grant it left has expired (the request's end plus the lease).
func (b *Bids) Open(run Run, token string, until time.Time) {
	i := strings.LastIndexByte(token, '-')
	if i < 0 {
		return
	}
	try, err := strconv.Atoi(token[i+1:])
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if b.open == nil {
		b.open = make(map[string]openBid)
	}
	if now.After(b.scan) {
		// Entries of runs never claimed again would stay for ever.
		for id, o := range b.open {
			if now.After(o.until) {
				delete(b.open, id)
			}
		}
		b.scan = now.Add(time.Minute)
	}
	b.open[run.ID()] = openBid{name: token[:i], try: try, until: until}
}

// OpenAll is Open for each run, with its token at the same index.
func (b *Bids) OpenAll(runs []Run, tokens []string, until time.Time) {
	for k, run := range runs {
		b.Open(run, tokens[k], until)
	}
}

// RunsAndTokens lists the runs and tokens of cls, index for index: what
// an undo of the grants sends.
func RunsAndTokens(cls []*Claim) ([]Run, []string) {
	runs, tokens := make([]Run, len(cls)), make([]string, len(cls))
	for k, cl := range cls {
		runs[k], tokens[k] = cl.Run, cl.Token
	}
	return runs, tokens
}
