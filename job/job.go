// Package job is the public surface for handler authors: the Handler type,
// what a handler learns about its run, and the Registry a binary fills
// before it starts the scheduler. A user's own main registers handlers here
// and hands the registry to cli.Main, which runs the same runtime as the
// shipped binary.
package job

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Causes a handler can find with context.Cause(ctx) when its context ends.
var (
	// ErrLeaseLost: the replica could not confirm its claim in time; another
	// replica may already be running this run with a higher fence. Stop
	// writing; fenced storage would reject the writes anyway.
	ErrLeaseLost = claim.ErrLeaseLost
	// ErrTimeout: the job's configured timeout passed.
	ErrTimeout = errors.New("job: timeout")
	// ErrShutdown: the replica is shutting down and shutdown_grace passed;
	// the run is released as interrupted and another replica takes it over.
	ErrShutdown = errors.New("job: replica shutting down")
)

// Handler executes one run. Handlers must be idempotent: a run whose holder
// lost its lease, or crashed after its side effects, is executed again by
// another replica with a higher Fence. Pass Fence to every write so fenced
// storage can reject a stale holder. Return when ctx is done.
type Handler func(ctx context.Context, run Run) error

// Run is what a handler knows about the run it executes.
type Run struct {
	Job         string
	ScheduledAt time.Time // the instant from the schedule, UTC
	ID          string    // same on every replica: job@instant
	Fence       int64     // strictly growing per job; pass it to fenced writes
	Attempt     int       // 1, then +1 per takeover
	Instance    string    // this replica
	Params      Params
	// Logger already carries job, scheduled_at, run_id, instance, claimer,
	// fence and attempt.
	Logger *slog.Logger
}

// Params are the job's free-form `params` from the config.
type Params map[string]any

// Duration reads a duration parameter ("1s", "250ms"), or def when absent.
func (p Params) Duration(key string, def time.Duration) (time.Duration, error) {
	v, ok := p[key]
	if !ok || v == nil {
		return def, nil
	}
	switch x := v.(type) {
	case string:
		d, err := time.ParseDuration(x)
		if err != nil {
			return 0, fmt.Errorf("params.%s: %q: %v", key, x, err)
		}
		return d, nil
	case time.Duration:
		return x, nil
	default:
		return 0, fmt.Errorf("params.%s: %v: want a duration such as \"1s\"", key, v)
	}
}

// String reads a string parameter, or def when absent.
func (p Params) String(key, def string) string {
	if v, ok := p[key].(string); ok {
		return v
	}
	return def
}

// Registry maps job names to handlers. It is safe for concurrent use.
type Registry struct {
	mu sync.RWMutex
	m  map[string]Handler
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[string]Handler{}} }

// Register adds a handler. A duplicate or empty name, or a nil handler, is
// an error: two handlers for one job would make "which one ran" a guess.
func (r *Registry) Register(name string, h Handler) error {
	if name == "" {
		return errors.New("job: register: empty job name")
	}
	if h == nil {
		return fmt.Errorf("job: register %q: nil handler", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[name]; dup {
		return fmt.Errorf("job: register %q: a handler is already registered under that name", name)
	}
	r.m[name] = h
	return nil
}

// MustRegister is Register for init-time wiring; it panics on error.
func (r *Registry) MustRegister(name string, h Handler) {
	if err := r.Register(name, h); err != nil {
		panic(err)
	}
}

// Lookup returns the handler registered under name.
func (r *Registry) Lookup(name string) (Handler, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h, ok := r.m[name]
	return h, ok
}

// Has reports whether name is registered.
func (r *Registry) Has(name string) bool { _, ok := r.Lookup(name); return ok }

// Names lists the registered job names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.m))
	for n := range r.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
