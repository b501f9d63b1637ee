package control

import (
	"fmt"
	"strings"
	"unicode"
)

// Limits of the operator's free text, wherever it is typed (the CLI, the
// HTTP API, the status page): it is stored in the register, shown in
// tables and logged, so a note of a megabyte or with a line break in a
// name would break them.
const (
	MaxNote      = 1024
	MaxBy        = 256
	MaxRequestID = 200
)

// CheckText checks an operator's free text: at most max bytes, no
// control characters (but line breaks and tabs where multiline), and no
// invisible format characters (bidirectional overrides, zero-width
// marks), which would make a name in a log line or a table read as
// another (outside review).
func CheckText(field, v string, max int, multiline bool) error {
	if len(v) > max {
		return fmt.Errorf("%s: longer than %d bytes", field, max)
	}
	for _, r := range v {
		if unicode.IsControl(r) && !(multiline && (r == '\n' || r == '\t')) {
			return fmt.Errorf("%s: contains a control character", field)
		}
		if unicode.Is(unicode.Cf, r) {
			return fmt.Errorf("%s: contains an invisible format character (U+%04X)", field, r)
		}
	}
	return nil
}

// CheckTexts checks a control's note, who set it and its request id
// (any may be empty).
func CheckTexts(note, by, requestID string) error {
	for _, f := range []struct {
		name, v   string
		max       int
		multiline bool
	}{{"note", note, MaxNote, true}, {"by", by, MaxBy, false}, {"request_id", requestID, MaxRequestID, false}} {
		if err := CheckText(f.name, f.v, f.max, f.multiline); err != nil {
			return err
		}
	}
	// An idempotency key is compared as it is, and an HTTP header
	// arrives trimmed: " x " in a body and "x" in X-Request-Id were two
	// keys (an outside review). Such a key is refused, not trimmed, so
	// that no caller's key is silently changed.
	if t := strings.TrimSpace(requestID); t != "" && t != requestID {
		return fmt.Errorf("request_id %q has leading or trailing whitespace", requestID)
	}
	return nil
}
