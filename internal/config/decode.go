package config

import (
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// decoder fills a Config from the YAML node tree itself rather than through
// yaml.Decode, so that every problem is located by its node (line and key
// path) instead of by parsing the library's error text, and decoding goes
// on after a bad value to report every one.
//
// Decoding starts from the defaults table: a key that is absent or null
// keeps its default, and so does an empty string (${NAME:-} then means
// "unset"), except for http.addr, where "" turns the server off.
type decoder struct {
	*problems
	// lines maps the path of every key or list item given a non-null value
	// to its line: Validate's errors take their line from it, and a derived
	// default applies only to a key it lacks.
	lines   map[string]int
	depth   int // nesting, aliases followed included
	values  int
	stopped bool // a bound was passed; the rest of the file is ignored
}

// Aliases and merge keys can make a small file expand exponentially, and an
// alias inside its own anchor would recurse forever: bound both. Config is
// 6 levels deep; the rest is for params.
const (
	maxDepth  = 64
	maxValues = 100_000
)

func (d *decoder) decode(path string, n *yaml.Node, v reflect.Value) {
	if !d.enter(path, n) {
		return
	}
	defer d.leave()
	if n.Kind == yaml.AliasNode {
		d.decode(path, n.Alias, v)
		return
	}
	if n.ShortTag() == "!!null" {
		return // keeps the default
	}
	if u, ok := v.Addr().Interface().(yaml.Unmarshaler); ok {
		if err := u.UnmarshalYAML(n); err != nil {
			d.at(n.Line, path, scalar(n), "%v", err)
		}
		return
	}
	switch {
	case v.Kind() == reflect.Struct:
		d.entries(path, n, func(kp string, k, val *yaml.Node) {
			d.locate(kp, k, val)
			f, ok := field(v, k.Value)
			if !ok {
				d.at(k.Line, kp, "", "unknown key")
				return
			}
			d.decode(kp, val, f)
		})
	case v.Kind() == reflect.Map:
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		d.entries(path, n, func(kp string, k, val *yaml.Node) {
			d.locate(kp, k, val)
			e := reflect.New(v.Type().Elem()).Elem()
			if j, ok := e.Addr().Interface().(*Job); ok {
				*j = jobDefaults // a job starts from its own table
			}
			d.decode(kp, val, e)
			v.SetMapIndex(reflect.ValueOf(k.Value), e)
		})
	case v.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.at(n.Line, path, scalar(n), "want a list")
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, e := range n.Content {
			ep := fmt.Sprintf("%s[%d]", path, i)
			d.locate(ep, e, e)
			d.decode(ep, e, s.Index(i))
		}
		v.Set(s)
	case v.Kind() == reflect.Interface && n.Kind != yaml.ScalarNode:
		// A param holding a mapping or a list: string keys at every level,
		// which Redacted relies on.
		x := reflect.New(reflect.TypeFor[[]any]()).Elem()
		if n.Kind == yaml.MappingNode {
			x = reflect.New(reflect.TypeFor[map[string]any]()).Elem()
		}
		d.decode(path, n, x)
		v.Set(x)
	default:
		// A string, bool, int or param scalar, resolved as yaml.Decode does.
		x := reflect.New(v.Type())
		if n.Kind != yaml.ScalarNode || n.Decode(x.Interface()) != nil {
			d.at(n.Line, path, scalar(n), "want %s", describe(v.Kind(), n))
			return
		}
		if v.Kind() != reflect.String || x.Elem().Len() > 0 || path == "http.addr" {
			v.Set(x.Elem()) // else "" keeps the default (see decoder)
		}
	}
}

// enter counts one more value and level (undone by leave), and stops
// decoding for good when either bound is passed.
func (d *decoder) enter(path string, n *yaml.Node) bool {
	if d.stopped {
		return false
	}
	switch d.values++; {
	case d.values > maxValues:
		d.at(n.Line, path, "", "more than %d values once aliases are expanded", maxValues)
	case d.depth == maxDepth:
		d.at(n.Line, path, "", "nested more than %d levels deep (does an alias refer to its own anchor?)", maxDepth)
	default:
		d.depth++
		return true
	}
	d.stopped = true
	return false
}

func (d *decoder) leave() { d.depth-- }

// entries calls f for each key of the mapping n and then, as yaml.Decode
// does, for each key merged in with "<<" that is not set yet (an earlier
// merge wins over a later one). A key written twice is an error.
func (d *decoder) entries(path string, n *yaml.Node, f func(kp string, k, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		d.at(n.Line, path, scalar(n), "want a mapping")
		return
	}
	seen := map[string]int{} // key → line
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		kp := join(path, k.Value)
		first, dup := seen[k.Value]
		switch {
		case k.Kind != yaml.ScalarNode:
			d.at(k.Line, path, "", "want a plain key")
		case k.ShortTag() == "!!merge":
			merges = append(merges, v)
		case dup:
			d.at(k.Line, kp, "", "defined twice (first at line %d)", first)
		default:
			seen[k.Value] = k.Line
			f(kp, k, v)
		}
	}
	for _, m := range merges {
		d.merge(path, m, func(kp string, k, v *yaml.Node) {
			if _, set := seen[k.Value]; !set {
				seen[k.Value] = k.Line
				f(kp, k, v)
			}
		})
	}
}

// merge passes f the entries of the mapping, or of each mapping in the
// list, that a "<<" key names.
func (d *decoder) merge(path string, m *yaml.Node, f func(kp string, k, v *yaml.Node)) {
	if !d.enter(path, m) {
		return
	}
	defer d.leave()
	switch m.Kind {
	case yaml.AliasNode:
		d.merge(path, m.Alias, f)
	case yaml.SequenceNode:
		for _, e := range m.Content {
			d.merge(path, e, f)
		}
	default:
		d.entries(path, m, f)
	}
}

// locate records the line of key k at path, given the value v.
func (d *decoder) locate(path string, k, v *yaml.Node) {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	if v.ShortTag() != "!!null" {
		d.lines[path] = k.Line
	}
}

// field returns the field of struct v whose yaml tag is key.
func field(v reflect.Value, key string) (reflect.Value, bool) {
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); f.IsExported() && tag != "-" && tag == key {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// scalar is the value an error shows: a scalar's text, nothing for a
// mapping or a list.
func scalar(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

// describe says how a value of kind k is written; n is what was written
// instead.
func describe(k reflect.Kind, n *yaml.Node) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Int:
		return "an integer"
	case reflect.Bool:
		return "true or false"
	}
	return "a value that matches its tag " + n.ShortTag() // a param
}
