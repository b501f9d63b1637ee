package job

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/scheduler-dev/scheduler/internal/config"
)

// paramDecoder fills a params struct from the map the configuration
// decoded (string keys at every level; strings, ints, floats, bools,
// nested maps and lists), going on after a bad value to report every one.
// Types are checked at registration (checkType), so a kind it does not
// handle here cannot occur.
type paramDecoder struct{ errs []error }

// decodeParams decodes p into v, a struct, and returns the problems joined,
// each a *ParamError of job.
func decodeParams(job string, p Params, v reflect.Value) error {
	d := &paramDecoder{}
	d.decode("", map[string]any(orEmpty(p)), v)
	for _, err := range d.errs {
		pe := err.(*ParamError)
		pe.Job = job
		pe.Value = redact(pe.Key, pe.Value)
	}
	return errors.Join(d.errs...)
}

// orEmpty treats absent params as empty ones, so the struct's Validate
// still runs.
func orEmpty(p Params) Params {
	if p == nil {
		return Params{}
	}
	return p
}

func (d *paramDecoder) add(key string, x any, format string, args ...any) {
	d.errs = append(d.errs, &ParamError{Key: key, Value: show(x), Msg: fmt.Sprintf(format, args...)})
}

func (d *paramDecoder) decode(path string, x any, v reflect.Value) {
	if x == nil {
		return // absent or null: the field keeps its value
	}
	t := v.Type()
	switch {
	case t.Kind() == reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(t.Elem()))
		}
		d.decode(path, x, v.Elem())
		return
	case t == durationType:
		d.duration(path, x, v)
		return
	case t == timeType:
		d.time(path, x, v)
		return
	case reflect.PointerTo(t).Implements(textType):
		s, ok := x.(string)
		if !ok {
			d.add(path, x, "want a string")
		} else if err := v.Addr().Interface().(interface{ UnmarshalText([]byte) error }).UnmarshalText([]byte(s)); err != nil {
			d.add(path, x, "%v", err)
		}
		return
	}
	switch t.Kind() {
	case reflect.String:
		if s, ok := x.(string); ok {
			v.SetString(s)
		} else {
			d.add(path, x, "want a string")
		}
	case reflect.Bool:
		if b, ok := x.(bool); ok {
			v.SetBool(b)
		} else {
			d.add(path, x, "want true or false")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := asInt(x)
		bits := t.Bits()
		switch {
		case !isInteger(x):
			d.add(path, x, "want an integer")
		case !ok || v.OverflowInt(n):
			d.add(path, x, "want an integer from %d to %d", int64(-1)<<(bits-1), int64(1)<<(bits-1)-1)
		default:
			v.SetInt(n)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, ok := asUint(x)
		switch {
		case !isInteger(x):
			d.add(path, x, "want an integer")
		case !ok || v.OverflowUint(n):
			d.add(path, x, "want an integer from 0 to %d", uint64(math.MaxUint64)>>(64-t.Bits()))
		default:
			v.SetUint(n)
		}
	case reflect.Float32, reflect.Float64:
		f, ok := asFloat(x)
		switch {
		case !ok:
			d.add(path, x, "want a number")
		case v.OverflowFloat(f):
			d.add(path, x, "out of range")
		default:
			v.SetFloat(f)
		}
	case reflect.Interface:
		v.Set(reflect.ValueOf(x))
	case reflect.Slice:
		xs := reflect.ValueOf(x)
		if xs.Kind() != reflect.Slice {
			d.add(path, x, "want a list")
			return
		}
		s := reflect.MakeSlice(t, xs.Len(), xs.Len())
		for i := range xs.Len() {
			d.decode(fmt.Sprintf("%s[%d]", path, i), xs.Index(i).Interface(), s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		m, ok := asMap(x)
		if !ok {
			d.add(path, x, "want a mapping")
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMapWithSize(t, len(m)))
		}
		for _, k := range sortedKeys(m) {
			e := reflect.New(t.Elem()).Elem()
			d.decode(join(path, k), m[k], e)
			v.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), e)
		}
	case reflect.Struct:
		m, ok := asMap(x)
		if !ok {
			d.add(path, x, "want a mapping")
			return
		}
		d.fields(path, m, v)
	}
}

// fields decodes the struct v from m, then, if that went well, calls its
// Validate method.
func (d *paramDecoder) fields(path string, m map[string]any, v reflect.Value) {
	fs, _ := fieldsOf(v.Type()) // checked at registration
	before := len(d.errs)
	for _, k := range sortedKeys(m) {
		i := slices.IndexFunc(fs, func(f field) bool { return f.key == k })
		if i < 0 {
			d.add(join(path, k), nil, "%s", unknownKey(fs))
			continue
		}
		d.decode(join(path, k), m[k], v.FieldByIndex(fs[i].index))
	}
	if len(d.errs) > before || !reflect.PointerTo(v.Type()).Implements(validateType) {
		return
	}
	d.validated(path, callValidate(v.Addr().Interface().(interface{ Validate() error })))
}

// callValidate calls a params struct's Validate, its panic an error: a
// Validate that panicked took `run --check` and `jobs` down with a Go
// stack trace (an outside review), where a handler's panic is a failed
// run.
func callValidate(p interface{ Validate() error }) (err error) {
	defer func() {
		if x := recover(); x != nil {
			err = fmt.Errorf("params: Validate panicked: %v", x)
		}
	}()
	return p.Validate()
}

// validated records what Validate returned for the struct at path: each
// *ParamError among joined errors with its key under path, any other error
// as a problem of the struct as a whole.
func (d *paramDecoder) validated(path string, err error) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			d.validated(path, e)
		}
		return
	}
	var pe *ParamError
	if errors.As(err, &pe) {
		c := *pe
		c.Key = join(path, pe.Key)
		d.errs = append(d.errs, &c)
		return
	}
	d.errs = append(d.errs, &ParamError{Key: path, Msg: err.Error(), Err: err})
}

func unknownKey(fs []field) string {
	if len(fs) == 0 {
		return "unknown key: this job takes no params"
	}
	keys := make([]string, len(fs))
	for i, f := range fs {
		keys[i] = f.key
	}
	slices.Sort(keys)
	return "unknown key; want one of " + strings.Join(keys, ", ")
}

// duration takes a Go duration string, or 0, as config.Duration does.
func (d *paramDecoder) duration(path string, x any, v reflect.Value) {
	var dur time.Duration
	var err error
	switch x := x.(type) {
	case string:
		dur, err = time.ParseDuration(x)
	case time.Duration:
		dur = x
	default:
		if n, ok := asInt(x); !ok || n != 0 {
			err = errors.New("not a duration")
		}
	}
	if err != nil {
		d.add(path, x, `want a duration such as "1s"`)
		return
	}
	v.SetInt(int64(dur))
}

// timestampLayouts are the forms a YAML timestamp takes (yaml.v3's).
var timestampLayouts = []string{
	"2006-1-2T15:4:5.999999999Z07:00",
	"2006-1-2t15:4:5.999999999Z07:00",
	"2006-1-2 15:4:5.999999999",
	"2006-1-2",
}

// time takes a time.Time, or a string in a YAML timestamp's form: the
// configuration hands an unquoted date over as a string.
func (d *paramDecoder) time(path string, x any, v reflect.Value) {
	switch x := x.(type) {
	case time.Time:
		v.Set(reflect.ValueOf(x))
		return
	case string:
		for _, l := range timestampLayouts {
			if t, err := time.Parse(l, x); err == nil {
				v.Set(reflect.ValueOf(t))
				return
			}
		}
	}
	d.add(path, x, "want a date such as 2026-01-31 or a time such as 2026-01-31T02:30:00Z")
}

func isInteger(x any) bool {
	switch reflect.ValueOf(x).Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// asInt returns the integer x as an int64, if it is one and fits.
func asInt(x any) (int64, bool) {
	rv := reflect.ValueOf(x)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int64(rv.Uint()), rv.Uint() <= math.MaxInt64
	}
	return 0, false
}

// asUint returns the integer x as a uint64, if it is one and not negative.
func asUint(x any) (uint64, bool) {
	rv := reflect.ValueOf(x)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return uint64(rv.Int()), rv.Int() >= 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return rv.Uint(), true
	}
	return 0, false
}

// asFloat returns the number x as a float64.
func asFloat(x any) (float64, bool) {
	rv := reflect.ValueOf(x)
	switch rv.Kind() {
	case reflect.Float32, reflect.Float64:
		return rv.Float(), true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return float64(rv.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return float64(rv.Uint()), true
	}
	return 0, false
}

func asMap(x any) (map[string]any, bool) {
	switch m := x.(type) {
	case map[string]any:
		return m, true
	case Params:
		return m, true
	}
	return nil, false
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func join(path, key string) string {
	switch {
	case path == "":
		return key
	case key == "":
		return path
	}
	return path + "." + key
}

// show is the value an error quotes: a scalar as written, nothing for a
// mapping or a list.
func show(x any) string {
	switch x := x.(type) {
	case nil:
		return ""
	case string:
		return x
	case time.Time:
		return x.Format(time.RFC3339Nano)
	}
	switch reflect.ValueOf(x).Kind() {
	case reflect.Map, reflect.Slice:
		return ""
	}
	return fmt.Sprint(x)
}

// redact hides the value of a param whose key (a path within the params:
// "a.b", "list[2].c") names a secret at any level, and masks DSN passwords
// in any other: the rule config applies to params (redactParam there),
// where a secret's name hides its whole subtree. Only the last element
// was looked at, and credentials.pass and secrets.db were shown (an
// outside review).
func redact(key, value string) string {
	if value == "" {
		return ""
	}
	for _, name := range strings.FieldsFunc(key, func(r rune) bool { return r == '.' || r == '[' || r == ']' }) {
		if config.IsSecretName(name) {
			return "xxxxx"
		}
	}
	return config.Redact(value)
}
