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
	"reflect"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/config"
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
	Params      Params    // this run's own copy: a handler may change it; no other run sees that
	// Logger already carries job, scheduled_at, run_id, instance, claimer,
	// fence and attempt.
	Logger *slog.Logger
}

// Params are the job's `params` from the config. A handler that declares
// them as a struct (Typed, WithParams) gets them decoded and checked before
// anything runs; Decode, Duration and String read them by hand.
type Params map[string]any

// Clone returns a deep copy of p (nested mappings and lists copied too).
// Each run gets its own: one map shared by every run of a job carried a
// handler's writes into the next run, and concurrent runs writing it
// crashed the replica with "concurrent map writes" (an outside review).
func (p Params) Clone() Params {
	if p == nil {
		return nil
	}
	return cloneParam(map[string]any(p)).(map[string]any)
}

func cloneParam(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = cloneParam(e)
		}
		return out
	case Params:
		return Params(cloneParam(map[string]any(x)).(map[string]any))
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = cloneParam(e)
		}
		return out
	}
	return v
}

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

// Database is the configuration's `database` block: where job data such as
// invoices lives, apart from the claimer's bookkeeping.
type Database struct {
	Kind     string // "sqlite" or "postgres"
	Path     string // the file, for sqlite
	DSN      string // the connection string, for postgres
	Password string // for postgres: when set, replaces the DSN's password
}

// String shows the kind and the path, or the DSN without its password.
func (d Database) String() string {
	if d.Kind == "sqlite" {
		return d.Kind + " " + d.Path
	}
	return d.Kind + " " + config.Redact(d.DSN)
}

// GoString hides the password from %#v too.
func (d Database) GoString() string { return "job.Database{" + d.String() + "}" }

// Resources is what an Opener opens its job's resources from.
type Resources struct {
	// Database is the loaded configuration's database block.
	Database Database
	// Metrics is the registry that `scheduler run` serves on /metrics, for
	// the job's own metrics; nil for commands that serve none (trigger).
	Metrics prometheus.Registerer
}

// Opener opens what a job's handler needs (a database, a client) and
// returns the handler and a function that releases it (nil when there is
// nothing to release). On error it leaves nothing open. Commands call it
// once, through Registry.Open, and only when they execute the job: run for
// an enabled job, trigger for the job it triggers.
type Opener func(ctx context.Context, res Resources) (h Handler, close func() error, err error)

// Registry maps job names to handlers. It is safe for concurrent use.
//
// A job whose handler needs resources from the configuration, such as a
// connection to the `database` block, is registered with an Opener instead
// of a Handler. Config validation and `scheduler jobs` see its name at once;
// only the commands that execute it (run, trigger) open it, with Open.
type Registry struct {
	mu sync.RWMutex
	m  map[string]*entry
}

type entry struct {
	h      Handler // the registered handler, or for an opener, one calling bound
	open   Opener
	params reflect.Type // the struct declared with WithParams; nil: any params
	busy   bool         // guarded by Registry.mu: Open is opening or has opened it
	// bound is what open returned, until Open's close.
	bound atomic.Pointer[Handler]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{m: map[string]*entry{}} }

// Register adds a handler. A duplicate or empty name, or a nil handler, is
// an error: two handlers for one job would make "which one ran" a guess.
// WithParams among opts declares the job's params; RegisterTyped registers
// a TypedHandler with its params in one call.
func (r *Registry) Register(name string, h Handler, opts ...Option) error {
	if h == nil {
		return fmt.Errorf("job: register %q: nil handler", name)
	}
	return r.add(name, &entry{h: h}, opts)
}

// MustRegister is Register for init-time wiring; it panics on error.
func (r *Registry) MustRegister(name string, h Handler, opts ...Option) {
	if err := r.Register(name, h, opts...); err != nil {
		panic(err)
	}
}

// RegisterOpener adds a job whose handler Open gets from o. Until then,
// the handler Lookup returns for it fails every run. Names and opts are
// checked as by Register: declare the params here, with WithParams, since
// commands check them without opening the job.
func (r *Registry) RegisterOpener(name string, o Opener, opts ...Option) error {
	if o == nil {
		return fmt.Errorf("job: register %q: nil opener", name)
	}
	e := &entry{open: o}
	e.h = func(ctx context.Context, run Run) error {
		h := e.bound.Load()
		if h == nil {
			return fmt.Errorf("job %s: not opened: its handler is only available to commands that execute it", name)
		}
		return (*h)(ctx, run)
	}
	return r.add(name, e, opts)
}

// MustRegisterOpener is RegisterOpener for init-time wiring; it panics on
// error.
func (r *Registry) MustRegisterOpener(name string, o Opener, opts ...Option) {
	if err := r.RegisterOpener(name, o, opts...); err != nil {
		panic(err)
	}
}

func (r *Registry) add(name string, e *entry, opts []Option) error {
	if name == "" {
		return errors.New("job: register: empty job name")
	}
	if err := config.CheckJobName(name); err != nil {
		// The configuration could never name it (an outside review).
		return fmt.Errorf("job: register %q: %w", name, err)
	}
	for _, o := range opts {
		if o.apply == nil {
			continue // the zero Option
		}
		if err := o.apply(e); err != nil {
			return fmt.Errorf("job: register %q: %w", name, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[name]; dup {
		return fmt.Errorf("job: register %q: a handler is already registered under that name", name)
	}
	r.m[name] = e
	return nil
}

// Open calls the Opener of each job in names registered with one, so that
// the handlers Lookup returns for them run on what their openers returned,
// until the returned close. Names registered with a plain Handler, or not
// at all, and repeated names are skipped. ctx bounds the opening only. On error nothing stays
// open. A job that is open already (a second Open before the first one's
// close) is an error.
//
// close unbinds the handlers, then calls the openers' close functions in
// reverse order, returning their errors joined.
func (r *Registry) Open(ctx context.Context, res Resources, names ...string) (func() error, error) {
	var opened []*entry
	var closers []func() error
	closeAll := func() error {
		for _, e := range opened {
			e.bound.Store(nil)
		}
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			if closers[i] != nil {
				errs = append(errs, closers[i]())
			}
		}
		r.mu.Lock()
		for _, e := range opened {
			e.busy = false
		}
		r.mu.Unlock()
		opened, closers = nil, nil
		return errors.Join(errs...)
	}
	for _, name := range names {
		r.mu.Lock()
		e := r.m[name]
		if e == nil || e.open == nil || slices.Contains(opened, e) {
			r.mu.Unlock()
			continue
		}
		if e.busy {
			r.mu.Unlock()
			_ = closeAll()
			return nil, fmt.Errorf("job %s: already open", name)
		}
		e.busy = true
		r.mu.Unlock()
		opened = append(opened, e)
		h, c, err := e.open(ctx, res)
		if err == nil && h == nil {
			if c != nil {
				_ = c()
			}
			err = errors.New("opener returned a nil handler")
		}
		if err != nil {
			_ = closeAll()
			return nil, fmt.Errorf("job %s: open: %w", name, err)
		}
		closers = append(closers, c)
		e.bound.Store(&h)
	}
	return closeAll, nil
}

// Lookup returns the handler registered under name; for a job registered
// with an Opener, one that runs the handler Open bound.
func (r *Registry) Lookup(name string) (Handler, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.m[name]
	if !ok {
		return nil, false
	}
	return e.h, true
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
