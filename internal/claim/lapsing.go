package claim

import (
	"sync"
	"time"
)

// Lapsing is a map of entries each kept until a time its writer gives: a
// claimer's memory of its own grants and bids (etcd's revisions, Unseen),
// whose entries stop mattering once a lease has run out, and of which
// those nobody asks for again would otherwise stay for ever. Lapsed
// entries are swept as the map grows, once it has doubled since the last
// sweep: amortized O(1) a Set. It is safe for concurrent use; the zero
// value is ready to use.
type Lapsing[V any] struct {
	mu    sync.Mutex
	m     map[string]lapsingEntry[V]
	prune int // the size at which the next Set sweeps
}

type lapsingEntry[V any] struct {
	v     V
	until time.Time // local, monotonic
}

// Set keeps v under key until until.
func (l *Lapsing[V]) Set(key string, v V, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]lapsingEntry[V]{}
	}
	l.m[key] = lapsingEntry[V]{v: v, until: until}
	if len(l.m) >= l.prune {
		now := time.Now()
		for k, e := range l.m {
			if now.After(e.until) {
				delete(l.m, k)
			}
		}
		l.prune = max(2*len(l.m), 64)
	}
}

// Get returns the value under key, lapsed or not (until it is swept),
// and whether there is one.
func (l *Lapsing[V]) Get(key string) (V, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[key]
	return e.v, ok
}

// Take returns and forgets the value under key, if it has not lapsed.
func (l *Lapsing[V]) Take(key string) (V, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[key]
	delete(l.m, key)
	if !ok || !time.Now().Before(e.until) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// Drop forgets key.
func (l *Lapsing[V]) Drop(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}
