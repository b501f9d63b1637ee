package job

import (
	"cmp"
	"context"
	"encoding"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Typed params: a handler declares its job's `params` as a Go struct
// (Typed, WithParams, RegisterTyped), and commands check a configuration
// against it before anything runs (Registry.CheckParams), instead of every
// run failing on a bad value. Params.Decode states the decoding rules.

// TypedHandler is a handler that receives its job's params decoded into P.
type TypedHandler[P any] func(ctx context.Context, run Run, p P) error

// Typed returns a Handler that decodes run.Params into a P (Params.Decode) and
// calls f with it; a run whose params do not decode fails with the
// *ParamError without calling f. Register it with WithParams[P]() so that
// commands check the params before running, or use RegisterTyped, which
// does both. A nil f gives a nil Handler, which Register rejects. Typed
// panics if P is not a struct it can decode (see WithParams).
func Typed[P any](f TypedHandler[P]) Handler {
	if f == nil {
		return nil
	}
	if _, err := paramsType[P](); err != nil {
		panic(err)
	}
	return func(ctx context.Context, run Run) error {
		var p P
		if err := decodeParams(run.Job, run.Params, reflect.ValueOf(&p).Elem()); err != nil {
			return err
		}
		return f(ctx, run, p)
	}
}

// RegisterTyped registers f under name with its params declared as P:
// r.Register(name, Typed(f), WithParams[P]()), P stated once.
func RegisterTyped[P any](r *Registry, name string, f TypedHandler[P]) error {
	if _, err := paramsType[P](); err != nil {
		return fmt.Errorf("job: register %q: %w", name, err)
	}
	return r.Register(name, Typed(f), WithParams[P]())
}

// MustRegisterTyped is RegisterTyped for init-time wiring; it panics on
// error.
func MustRegisterTyped[P any](r *Registry, name string, f TypedHandler[P]) {
	if err := RegisterTyped(r, name, f); err != nil {
		panic(err)
	}
}

// An Option adds to what Register or RegisterOpener records about a job.
type Option struct{ apply func(*entry) error }

// WithParams declares that the job's params decode into the struct P
// (Params.Decode), so that Registry.CheckParams checks them. A job registered
// without it accepts any params. The handler, or the one an Opener
// returns, should be Typed with the same P. P must be a struct whose fields
// all have types the decoder knows (no channels, functions or maps with
// non-string keys), or registering fails.
func WithParams[P any]() Option {
	return Option{func(e *entry) error {
		t, err := paramsType[P]()
		e.params = t
		return err
	}}
}

// CheckParams decodes p as the params of the job registered under name,
// discarding the result, and returns every problem joined with
// errors.Join, each a *ParamError with Job set to name. It returns nil for
// a name that is not registered or declared no params (WithParams).
func (r *Registry) CheckParams(name string, p Params) error {
	r.mu.RLock()
	e := r.m[name]
	r.mu.RUnlock()
	if e == nil || e.params == nil {
		return nil
	}
	return decodeParams(name, p, reflect.New(e.params).Elem())
}

// Decode decodes p into v, a non-nil pointer to a struct, by its yaml tags,
// as the configuration itself is decoded, and strictly:
//
//   - A key without a field is an error. A field is named by its yaml tag,
//     else by its name in lower case, as yaml.v3 does; `yaml:"-"` hides it
//     and `yaml:",inline"` on a struct field lifts its fields into the
//     parent.
//   - A value of the wrong type is an error: a string field takes a string
//     only (quote a number meant as text), an integer field an integer in
//     its range, a bool true or false.
//   - time.Duration takes a Go duration string ("1s", "1h30m"); a bare
//     number other than 0 is an error, as in the configuration.
//   - time.Time takes a YAML timestamp: a date (2026-01-31) or an RFC 3339
//     time. A field whose type implements encoding.TextUnmarshaler takes a
//     string and that method's verdict.
//   - Structs nest; maps with string keys, slices, pointers and `any`
//     fields are decoded too. An absent or null key leaves the field as it
//     was: set defaults in v before, or use cmp.Or after.
//   - Once a struct has decoded without a problem, its method
//     Validate() error, if it has one, is called: the place for rules such
//     as "must be positive". Return a *ParamError to name the key (relative
//     to that struct), several joined with errors.Join; any other error is
//     reported against the struct's own key.
//
// Every problem is reported at once: the errors are *ParamError, joined
// with errors.Join; their Job is empty.
func (p Params) Decode(v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("job: decode params: want a non-nil pointer to a struct, got %T", v)
	}
	if err := checkType(rv.Type().Elem()); err != nil {
		return fmt.Errorf("job: decode params: %w", err)
	}
	return decodeParams("", p, rv.Elem())
}

// ParamError is one params value that a job's declared params reject.
type ParamError struct {
	Job string // the job; "" from Params.Decode
	// Key is the path inside params: "duration", "retry.max", "hosts[2]";
	// "" for the params as a whole.
	Key string
	// Value is the offending value as written; "" for a mapping or a list,
	// and masked when the key names a secret (password, token, key, …).
	Value string
	Msg   string // what is wrong
	// Err is the error Validate returned, when it was not a *ParamError.
	Err error
}

// ConfigKey is the key's path in the configuration:
// jobs.<job>.params.<key>.
func (e *ParamError) ConfigKey() string {
	k := "params"
	if e.Job != "" {
		k = "jobs." + e.Job + ".params"
	}
	if e.Key != "" {
		k += "." + e.Key
	}
	return k
}

// Error formats as the configuration's errors do: `key: "value": msg`.
func (e *ParamError) Error() string {
	s := e.ConfigKey() + ": "
	if e.Value != "" {
		s += strconv.Quote(e.Value) + ": "
	}
	return s + e.Msg
}

func (e *ParamError) Unwrap() error { return e.Err }

var (
	durationType = reflect.TypeFor[time.Duration]()
	timeType     = reflect.TypeFor[time.Time]()
	textType     = reflect.TypeFor[encoding.TextUnmarshaler]()
	validateType = reflect.TypeFor[interface{ Validate() error }]()
)

// paramsType returns P's type if the decoder can fill it.
func paramsType[P any]() (reflect.Type, error) {
	t := reflect.TypeFor[P]()
	if err := checkType(t); err != nil {
		return nil, err
	}
	return t, nil
}

// checkType reports a params type the decoder cannot fill: a programmer's
// error, found at registration rather than at the first run.
func checkType(t reflect.Type) error {
	if t.Kind() != reflect.Struct {
		return fmt.Errorf("params type %v: want a struct", t)
	}
	return checkField(t, t.String(), map[reflect.Type]bool{})
}

func checkField(t reflect.Type, where string, seen map[reflect.Type]bool) error {
	if seen[t] || t == durationType || t == timeType || reflect.PointerTo(t).Implements(textType) {
		return nil
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return nil
	case reflect.Interface:
		if t.NumMethod() == 0 {
			return nil
		}
	case reflect.Pointer, reflect.Slice:
		return checkField(t.Elem(), where, seen)
	case reflect.Map:
		if t.Key().Kind() == reflect.String {
			return checkField(t.Elem(), where, seen)
		}
	case reflect.Struct:
		fs, err := fieldsOf(t)
		if err != nil {
			return fmt.Errorf("params type %s: %w", where, err)
		}
		for _, f := range fs {
			ft := t.FieldByIndex(f.index)
			if err := checkField(ft.Type, where+"."+ft.Name, seen); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("params type %s: %v cannot be decoded from params", where, t)
}

// field is a struct field and the key that sets it.
type field struct {
	key   string
	index []int
}

// fieldsOf lists t's keys by yaml.v3's rules: the tag's name, else the
// field's name in lower case; "-" skips a field, ",inline" lifts a struct
// field's own.
func fieldsOf(t reflect.Type) ([]field, error) {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if !f.IsExported() || tag == "-" {
			continue
		}
		if slices.Contains(strings.Split(opts, ","), "inline") {
			if f.Type.Kind() != reflect.Struct {
				return nil, fmt.Errorf("field %s: inline needs a struct", f.Name)
			}
			inner, err := fieldsOf(f.Type)
			if err != nil {
				return nil, err
			}
			for _, in := range inner {
				out = append(out, field{in.key, append([]int{i}, in.index...)})
			}
			continue
		}
		out = append(out, field{cmp.Or(name, strings.ToLower(f.Name)), []int{i}})
	}
	for i, f := range out {
		if slices.ContainsFunc(out[:i], func(g field) bool { return g.key == f.key }) {
			return nil, fmt.Errorf("key %q names two fields", f.key)
		}
	}
	return out, nil
}
