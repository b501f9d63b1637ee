package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Control is one entry of the operator's state that a backend keeps beside
// its runs: a pause switch, a request to run a job now. The backend stores
// it opaquely; internal/control gives it meaning. Every replica reads the
// same entries, so a control reaches the whole fleet through the one
// backend the fleet already shares.
type Control struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
	// Version orders the writes of one key (the writer's clock in unix
	// nanoseconds); the highest wins: the latest pause or resume.
	// With First the entry stored first stays, whatever its version: the
	// first request made under an idempotency key, which a retry (from a
	// host whose clock may be behind) must learn of, never replace. A
	// quorum backend (redlock) settles first puts that raced and split its
	// nodes by the lowest version.
	Version int64 `json:"version"`
	First   bool  `json:"first,omitempty"`
	// Expires is when the entry is forgotten, on the backend's clock;
	// zero means never. An expired entry is absent to Put and List.
	Expires time.Time `json:"expires,omitzero"`
}

// Wins reports whether c takes the place of stored, an unexpired entry of
// the same key: never with First, otherwise when its version is higher.
// A tie keeps the stored entry, so a retried Put changes nothing.
func (c Control) Wins(stored Control) bool {
	return !c.First && c.Version > stored.Version
}

// Expired reports whether c is past its expiry at now.
func (c Control) Expired(now time.Time) bool {
	return !c.Expires.IsZero() && !now.Before(c.Expires)
}

// Controls is the capability every backend offers beside its Claimer (the
// opener hands it out as a field): a small register of operator state.
// Implementations are safe for concurrent use and honour ctx.
type Controls interface {
	// Put stores c under c.Key unless the key holds an unexpired entry
	// that wins over it (see Control.Wins), and returns the entry the key
	// holds afterwards: c, or the one that won.
	Put(ctx context.Context, c Control) (Control, error)
	// List returns the unexpired entries whose keys start with prefix,
	// sorted by key.
	List(ctx context.Context, prefix string) ([]Control, error)
}

// PrefixLister is a Controls that reads the entries under several prefixes
// in one pass. A replica reads five kinds of entry every tick; where every
// List walks the whole register (Redis keeps it in one hash, of one
// schedule entry per job), five Lists are five walks. Optional: see
// ListPrefixes.
type PrefixLister interface {
	// ListPrefixes returns the unexpired entries whose keys start with
	// any of prefixes, each once, sorted by key.
	ListPrefixes(ctx context.Context, prefixes []string) ([]Control, error)
}

// ListPrefixes returns the unexpired entries of reg whose keys start with
// any of prefixes, each once, sorted by key: in one pass where reg is a
// PrefixLister, else with one List per prefix, sent at once, so it costs
// one round trip of latency either way.
func ListPrefixes(ctx context.Context, reg Controls, prefixes ...string) ([]Control, error) {
	if pl, ok := reg.(PrefixLister); ok {
		return pl.ListPrefixes(ctx, prefixes)
	}
	lists := make([][]Control, len(prefixes))
	errs := make([]error, len(prefixes))
	var wg sync.WaitGroup
	for i, p := range prefixes {
		wg.Go(func() { lists[i], errs[i] = reg.List(ctx, p) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// Prefixes may overlap ("pause/" and "pause/a"): an entry is listed
	// once.
	out := slices.Concat(lists...)
	slices.SortStableFunc(out, func(a, b Control) int { return strings.Compare(a.Key, b.Key) })
	return slices.CompactFunc(out, func(a, b Control) bool { return a.Key == b.Key }), nil
}

// BatchPutter is a Controls that stores many entries in one request. A
// replica that wins thousands of runs due at one instant writes as many
// schedule entries (the drift guard's): one Put each would be as many
// round trips, competing with the claims of that instant. Optional: see
// PutBatch.
type BatchPutter interface {
	// PutBatch stores each of cs as Put would and returns, for each, what
	// Put would: the entry its key holds afterwards, or an error. Each
	// entry is decided on its own, as by its own Put.
	PutBatch(ctx context.Context, cs []Control) ([]Control, []error)
}

// putFanout is how many Puts PutBatch keeps in flight on a register
// that is not a BatchPutter.
const putFanout = 4

// PutBatch stores each of cs in reg as reg.Put would and returns Put's
// answer for each: in one request where reg is a BatchPutter, else with
// at most putFanout Puts in flight.
func PutBatch(ctx context.Context, reg Controls, cs []Control) ([]Control, []error) {
	if bp, ok := reg.(BatchPutter); ok {
		return bp.PutBatch(ctx, cs)
	}
	got, errs := make([]Control, len(cs)), make([]error, len(cs))
	slots := make(chan struct{}, putFanout)
	var wg sync.WaitGroup
	for i, c := range cs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			got[i], errs[i] = reg.Put(ctx, c)
		})
	}
	wg.Wait()
	return got, errs
}

// CheckControl validates a Put's argument, then reports ctx's error if ctx
// is done: one check before any backend is asked.
func CheckControl(ctx context.Context, c Control) error {
	switch {
	case c.Key == "" || strings.ContainsAny(c.Key, "\x00\n"):
		return fmt.Errorf("%w: control key %q", ErrInvalid, c.Key)
	case c.Version <= 0:
		return fmt.Errorf("%w: control %q: version %d must be positive", ErrInvalid, c.Key, c.Version)
	}
	return ctx.Err()
}

// CheckControls is CheckControl for each of a PutBatch's entries: an error
// for each that fails, and the indexes of those that pass, in order.
func CheckControls(ctx context.Context, cs []Control) (errs []error, valid []int) {
	errs = make([]error, len(cs))
	for i, c := range cs {
		if errs[i] = CheckControl(ctx, c); errs[i] == nil {
			valid = append(valid, i)
		}
	}
	return errs, valid
}
