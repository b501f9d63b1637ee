package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// expand replaces ${NAME} and ${NAME:-default} in the raw text with values
// from lookup. Nothing else is touched: a lone '$', "$NAME" and "$$" stay as
// written, and "$${" is a literal "${". References in comments ('#' at the
// start of a line or after a blank, outside quotes) are left alone, so a
// commented-out line does not need its variables. The default (up to the
// first '}') is used when NAME is unset or empty. Every unset variable
// without a default and every malformed reference is reported, with its
// line; a malformed reference's text is not repeated, as it may be part of
// a secret. The lines of a block scalar (after "key: |" or "- >", more
// indented than it) are text to YAML: quotes and '#' there are the
// value's own.
func expand(file string, src []byte, lookup func(string) (string, bool)) ([]byte, []error) {
	var out strings.Builder
	out.Grow(len(src))
	var errs []error
	block := -1 // the indentation of the line that opened a block scalar; -1: none
	for n, line := range strings.SplitAfter(string(src), "\n") {
		indent := len(line) - len(strings.TrimLeft(line, " "))
		inBlock := block >= 0 && (strings.TrimSpace(line) == "" || indent > block)
		errs = append(errs, expandLine(&out, line, file, n+1, lookup, inBlock)...)
		switch {
		case inBlock:
		case blockOpener.MatchString(strings.TrimRight(line, "\r\n")):
			block = indent
		default:
			block = -1
		}
	}
	return []byte(out.String()), errs
}

// blockOpener matches a line whose value is a block scalar's indicator
// ("key: |", "- >-", "key: |2 # comment").
var blockOpener = regexp.MustCompile(`(?:^|:\s|-\s)\s*[|>][-+1-9]{0,2}\s*(?:\s#.*)?$`)

// expandLine expands line's references; literal, line is a block
// scalar's, where quotes and '#' are text.
func expandLine(out *strings.Builder, line, file string, lineNo int, lookup func(string) (string, bool), literal bool) []error {
	var errs []error
	var quote byte    // the open quote, or 0
	from := out.Len() // where this line's output starts
	for i := 0; i < len(line); i++ {
		c := line[i]
		prev := byte(' ')
		if i > 0 {
			prev = line[i-1]
		}
		switch {
		case literal && c != '$':
		case quote == '"' && c == '\\' && i+1 < len(line):
			out.WriteString(line[i : i+2])
			i++
			continue
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '"' || c == '\'') && strings.IndexByte(" \t[{,", prev) >= 0:
			quote = c
		case quote == 0 && c == '#' && (prev == ' ' || prev == '\t'):
			out.WriteString(line[i:]) // a comment
			return errs
		case c == '$' && strings.HasPrefix(line[i:], "$${"):
			out.WriteString("${")
			i += 2
			continue
		case c == '$' && strings.HasPrefix(line[i:], "${"):
			n, val, err := reference(line[i:], lookup)
			switch {
			case err == nil && literal && strings.ContainsAny(val, "\r\n"):
				// The value's next line would fall out of the block.
				err = misread(line[i:i+n], val, '\'', prev, false)
			case err == nil && !literal:
				err = misread(line[i:i+n], val, quote, prev, startsScalar(out.String()[from:]))
			}
			if err != nil {
				errs = append(errs, &Error{File: file, Line: lineNo, Msg: err.Error()})
			}
			out.WriteString(val)
			i += n - 1
			continue
		}
		out.WriteByte(c)
	}
	return errs
}

// reference expands the reference that s starts with ("${…"), returning its
// length, its value and an error for an unset or malformed reference.
func reference(s string, lookup func(string) (string, bool)) (int, string, error) {
	end := strings.IndexByte(s, '}')
	if end < 0 {
		return len(strings.TrimRight(s, "\r\n")), "", errors.New("unterminated ${ (write $${ for a literal ${)")
	}
	ref := s[:end+1]
	name, def, hasDef := strings.Cut(s[2:end], ":-")
	if !validEnvName(name) {
		return len(ref), "", errors.New("malformed ${…}: want ${NAME} or ${NAME:-default} (write $${ for a literal ${)")
	}
	v, ok := lookup(name)
	switch {
	case hasDef && v == "":
		return len(ref), def, nil
	case !ok:
		return len(ref), "", fmt.Errorf("${%s}: environment variable %s is not set (give a default with ${%s:-default})", name, name, name)
	}
	return len(ref), v, nil
}

func validEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// misread explains why YAML would not read val, the value of ref, as
// written where ref stands: inside quote (0 outside quotes), after prev,
// first if it starts a plain value.
// The text is put in before YAML parses the line, so a value holding a
// blank and a '#' outside quotes would be cut short as a comment (a
// password "s3cret #x" became "s3cret", and a DSN without its '@' was
// shown with the rest of its password: an outside review), and a quote or
// a backslash would end or escape a quoted value. Such a value is an
// error, not a silent change; the value is never shown.
func misread(ref, val string, quote, prev byte, first bool) error {
	var why string
	switch {
	case strings.ContainsAny(val, "\r\n"):
		why = "a line break"
	case quote == 0 && first && val != "" && strings.IndexByte("&!*\"'[{|>%@`", val[0]) >= 0:
		why = fmt.Sprintf("a leading '%c', which YAML reads as syntax, not text, at the start of a value", val[0])
	case quote == 0 && (strings.Contains(val, " #") || strings.Contains(val, "\t#") ||
		strings.HasPrefix(val, "#") && (prev == ' ' || prev == '\t')):
		why = "a '#' after a blank, which YAML reads as the start of a comment here"
	case quote == '"' && strings.ContainsAny(val, `"\`):
		why = "a '\"' or a '\\', which YAML reads as the end of the quoted value or an escape here"
	case quote == '\'' && strings.Contains(val, "'"):
		why = "a \"'\", which YAML reads as the end of the quoted value here"
	default:
		return nil
	}
	hint := "write the reference inside single quotes ('" + ref + "')"
	if quote == '\'' || strings.ContainsAny(val, "\r\n") {
		hint = "give the secret in a file instead (password_file, token_file)"
	}
	return fmt.Errorf("%s: the value holds %s, so it would not be read as set; %s", ref, why, hint)
}

// startsScalar reports whether a plain value that began after before, a
// line's output so far, would begin a YAML value: after a key's ':', a
// list's '-', a flow collection's '[', '{' or ',', or alone on its line.
func startsScalar(before string) bool {
	t := strings.TrimRight(before, " \t")
	blank := len(t) < len(before) // "key:value" is not a key's
	switch {
	case strings.TrimLeft(t, " \t") == "":
		return true
	case strings.TrimLeft(t, " \t-") == "": // "- ", "- - "
		return blank
	}
	switch t[len(t)-1] {
	case ':':
		return blank
	case '[', '{', ',':
		return true
	}
	return false
}
