package config

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// index maps the YAML tree to key paths: which keys are present (with a
// non-null value), the line of each key, and what sits on each line, to
// turn the decoder's "line N: …" messages into key paths.
type index struct {
	lines  map[string]int     // key path → line of the key
	byLine map[int][]location // line → keys and values on it
	set    map[string]bool
	visits int // bounds the walk, which expands merge keys
}

type location struct {
	path, key string
	val       *yaml.Node
}

// maxIndexed bounds the walk: nested merge keys could otherwise expand
// exponentially (the decoder itself rejects excessive aliasing).
const maxIndexed = 100_000

func newIndex(root *yaml.Node) *index {
	ix := &index{lines: map[string]int{}, byLine: map[int][]location{}, set: map[string]bool{}}
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		ix.walk("", root.Content[0], 0, map[*yaml.Node]bool{})
	}
	return ix
}

func (ix *index) present(path string) bool { return ix.set[path] }

func (ix *index) walk(prefix string, n *yaml.Node, depth int, merging map[*yaml.Node]bool) {
	ix.visits++
	if depth > 64 || ix.visits > maxIndexed {
		return
	}
	join := func(k string) string {
		if prefix == "" {
			return k
		}
		return prefix + "." + k
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" && k.Tag == "!!merge" {
				for _, m := range append([]*yaml.Node{v}, v.Content...) {
					if m.Kind == yaml.AliasNode && m.Alias != nil && !merging[m.Alias] {
						merging[m.Alias] = true
						ix.walk(prefix, m.Alias, depth+1, merging)
						delete(merging, m.Alias)
					}
				}
				continue
			}
			path := join(k.Value)
			if _, ok := ix.lines[path]; !ok {
				ix.lines[path] = k.Line
			}
			loc := location{path: path, key: k.Value, val: v}
			ix.byLine[k.Line] = append(ix.byLine[k.Line], loc)
			if v.Line != k.Line {
				ix.byLine[v.Line] = append(ix.byLine[v.Line], loc)
			}
			if v.Tag != "!!null" && !(v.Kind == yaml.AliasNode && v.Alias != nil && v.Alias.Tag == "!!null") {
				ix.set[path] = true
			}
			ix.walk(path, v, depth+1, merging)
		}
	case yaml.SequenceNode:
		for i, v := range n.Content {
			path := fmt.Sprintf("%s[%d]", prefix, i)
			ix.byLine[v.Line] = append(ix.byLine[v.Line], location{path: path, val: v})
			ix.walk(path, v, depth+1, merging)
		}
	}
}

var (
	lineMsg    = regexp.MustCompile(`^line (\d+): (.*)$`)
	notFound   = regexp.MustCompile(`^field (.*) not found in type \S+$`)
	alreadySet = regexp.MustCompile(`^field (.*) already set in type \S+$`)
	dupKey     = regexp.MustCompile(`^mapping key "(.*)" already defined at line (\d+)$`)
	cannot     = regexp.MustCompile("^cannot unmarshal (\\S+?)(?: `(.*)`)? into (.+)$")
)

// translate turns one message of a *yaml.TypeError into an *Error naming
// the key. Values of keys that hold secrets are not repeated.
func (ix *index) translate(file, msg string) error {
	m := lineMsg.FindStringSubmatch(msg)
	if m == nil {
		return &Error{File: file, Msg: msg}
	}
	line, _ := strconv.Atoi(m[1])
	rest := m[2]
	e := &Error{File: file, Line: line}
	var at *location
	find := func(match func(location) bool) {
		for i, l := range ix.byLine[line] {
			if match(l) {
				e.Key, at = l.path, &ix.byLine[line][i]
				return
			}
		}
	}
	if m := notFound.FindStringSubmatch(rest); m != nil {
		find(func(l location) bool { return l.key == m[1] })
		e.Msg = "unknown key"
		if e.Key == "" {
			e.Msg = fmt.Sprintf("unknown key %q", m[1])
		}
		return e
	}
	if m := alreadySet.FindStringSubmatch(rest); m != nil {
		find(func(l location) bool { return l.key == m[1] })
		e.Msg = "set twice"
		return e
	}
	if m := dupKey.FindStringSubmatch(rest); m != nil {
		find(func(l location) bool { return l.key == m[1] })
		e.Msg = "defined twice (first at line " + m[2] + ")"
		return e
	}
	if v, why, ok := strings.Cut(rest, "`: "); ok && strings.HasPrefix(v, badDuration+"`") {
		v = strings.TrimPrefix(v, badDuration+"`")
		find(func(l location) bool { return l.val.Line == line && l.val.Value == v })
		e.Msg = why
	} else if m := cannot.FindStringSubmatch(rest); m != nil {
		shown := strings.TrimSuffix(m[2], "...")
		kind := map[string]yaml.Kind{"!!seq": yaml.SequenceNode, "!!map": yaml.MappingNode}[m[1]]
		if kind == 0 {
			kind = yaml.ScalarNode
		}
		// A block mapping starts on the line of its first key, so a parent
		// and a child can both match; prefer the deepest (the last one).
		for i := len(ix.byLine[line]) - 1; i >= 0 && at == nil; i-- {
			l := ix.byLine[line][i]
			if l.val.Line == line && l.val.Kind == kind && strings.HasPrefix(l.val.Value, shown) {
				e.Key, at = l.path, &ix.byLine[line][i]
			}
		}
		e.Msg = "want " + describe(m[3])
	} else {
		e.Msg = rest
	}
	if at == nil {
		// Without the key we cannot tell whether the value is a secret.
		e.Msg, _, _ = strings.Cut(e.Msg, "`")
		return e
	}
	if at.val.Kind == yaml.ScalarNode {
		e.Value = at.val.Value
	}
	switch k := strings.ToLower(e.Key); {
	case strings.Contains(k, "password") || strings.Contains(k, "params"):
		e.Value = ""
	case strings.Contains(k, "dsn") || strings.Contains(k, "addr"):
		e.Value = Redact(e.Value)
	}
	return e
}

// describe names the Go type a YAML value should have decoded into.
func describe(goType string) string {
	switch {
	case goType == "int" || goType == "int64":
		return "an integer"
	case goType == "bool":
		return "true or false"
	case goType == "string" || goType == "config.Secret":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	}
	return "a mapping"
}
