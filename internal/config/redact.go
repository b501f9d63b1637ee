package config

import (
	"errors"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Redact returns dsn with every password replaced by "xxxxx": the password
// of a URL's user info (postgres://u:xxxxx@h/db), password= and sslpassword=
// query parameters, and password=… in key=value DSNs (quoted or not). For a
// malformed URL it masks generously (everything between the first ':' of
// the user info and the last '@'), since leaking is worse than hiding too
// much. Use it wherever a DSN is shown.
func Redact(dsn string) string {
	spans := passwordSpans(dsn)
	if len(spans) == 0 {
		return dsn
	}
	var b strings.Builder
	last := 0
	for _, s := range spans {
		b.WriteString(dsn[last:s.start])
		b.WriteString(mask)
		last = s.end
	}
	b.WriteString(dsn[last:])
	return b.String()
}

// RedactError returns err's text with every password of dsn masked, for an
// error from parsing or connecting with dsn. pgx masks passwords in its
// messages only where it recognises them (not in "password = x", with
// spaces), and a pgconn.ParseConfigError repeats the whole DSN, which is
// dropped: the caller shows the DSN, through Redact, if it wants to.
func RedactError(err error, dsn string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		// "cannot parse `<dsn>`: why (cause)": keep only "why (cause)".
		if i := strings.LastIndex(msg, "`: "); i >= 0 {
			msg = msg[i+len("`: "):]
		}
	}
	return errors.New(scrub(msg, dsn))
}

// secretWords make a name a secret's.
var secretWords = []string{"password", "secret", "token", "credential", "key", "authorization"}

// IsSecretName reports whether a setting or param called name holds a
// secret (see redactValue): the one rule, which package job applies to
// typed params too.
func IsSecretName(name string) bool { return secretName(name) }

// redactValue is the one rule for showing the value of a setting or a job
// param called name, used by Redacted and for every *Error: a name holding
// one of secretWords hides the value whole, unless it ends in _file (it
// names the secret's file); any other value is shown with the passwords of
// a DSN in it masked (Redact), since a DSN or an address can carry one
// under any name.
func redactValue(name, value string) string {
	switch {
	case value == "":
		return ""
	case secretName(name):
		return mask
	}
	return Redact(value)
}

func secretName(name string) bool {
	name = strings.ToLower(name)
	return !strings.HasSuffix(name, "_file") &&
		slices.ContainsFunc(secretWords, func(w string) bool { return strings.Contains(name, w) })
}

// redactParam applies redactValue to a job's params (v), nested mappings
// and lists included; a secret's name hides its value whole, whatever its
// type.
func redactParam(name string, v any) any {
	if secretName(name) {
		return mask
	}
	switch v := v.(type) {
	case string:
		return redactValue(name, v)
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = redactParam(k, x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = redactParam(name, x)
		}
		return out
	}
	return v
}

// span is a password's byte range in a DSN; key says where it was found:
// "userinfo", "password" or "sslpassword".
type span struct {
	start, end int
	key        string
}

// hasPassword reports whether dsn carries a login password (not an
// sslpassword, which unlocks a client key).
func hasPassword(dsn string) bool {
	return slices.ContainsFunc(passwordSpans(dsn), func(s span) bool { return s.key != "sslpassword" })
}

// passwordSpans finds the passwords in dsn, in order, not overlapping.
func passwordSpans(dsn string) []span {
	if i := strings.Index(dsn, "://"); i >= 0 {
		return urlSpans(dsn, i+len("://"))
	}
	spans := kvSpans(dsn)
	if len(spans) == 0 && strings.Contains(dsn, "@") {
		spans = urlSpans(dsn, 0) // host:port@… typed without a scheme
	}
	return spans
}

// urlSpans finds the user-info password and password query values of a URL
// whose authority starts at from.
func urlSpans(s string, from int) []span {
	var out []span
	rest := s[from:]
	authEnd := strings.IndexAny(rest, "/?#")
	if authEnd < 0 {
		authEnd = len(rest)
	}
	userEnd := -1 // index in rest of the '@' that ends the user info
	if strings.Contains(rest[authEnd:], "@") {
		// An '@' after the authority: either a password holding an unencoded
		// '/', '?' or '#', or an '@' in the path or query. Assume the former.
		userEnd = strings.LastIndexByte(rest, '@')
	} else {
		userEnd = strings.LastIndexByte(rest[:authEnd], '@')
	}
	queryFrom := 0
	if userEnd >= 0 {
		if c := strings.IndexByte(rest[:userEnd], ':'); c >= 0 {
			out = append(out, span{from + c + 1, from + userEnd, "userinfo"})
		}
		queryFrom = userEnd + 1
	}
	q := strings.IndexByte(rest[queryFrom:], '?')
	if q < 0 {
		return out
	}
	pos := from + queryFrom + q + 1
	for pair := range strings.SplitSeq(s[pos:], "&") {
		k, v, ok := strings.Cut(pair, "=")
		if key := queryKey(k); ok && (key == "password" || key == "sslpassword") {
			start := pos + len(k) + 1
			out = append(out, span{start, start + len(v), key})
		}
		pos += len(pair) + 1
	}
	return out
}

func queryKey(k string) string {
	if u, err := url.QueryUnescape(k); err == nil {
		k = u
	}
	return strings.ToLower(strings.TrimSpace(k))
}

// kvKey finds password= and sslpassword= in a key=value DSN; libpq allows
// spaces around '='.
var kvKey = regexp.MustCompile(`(?i)(?:^|\s)((?:ssl)?password)\s*=\s*`)

// kvSpans finds the password values of a key=value DSN. A quoted value ends
// at the next unescaped quote (or the end, if unterminated); a bare one at
// whitespace.
func kvSpans(s string) []span {
	var out []span
	for _, m := range kvKey.FindAllStringSubmatchIndex(s, -1) {
		start := m[1]
		if len(out) > 0 && start < out[len(out)-1].end {
			continue // inside the previous password's quoted value
		}
		end := start
		if start < len(s) && s[start] == '\'' {
			end++
			for end < len(s) && s[end] != '\'' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			end = min(end+1, len(s))
		} else {
			for end < len(s) && !isSpace(s[end]) {
				end++
			}
		}
		out = append(out, span{start, end, strings.ToLower(s[m[2]:m[3]])})
	}
	return out
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// checkPostgresDSN parses dsn as the claimer's pool will (its pool_*
// settings too: pool_max_conns=abc passed the check, then failed the
// replica at start-up, exit 1) and explains a failure without repeating
// the DSN or any part of its password.
func checkPostgresDSN(dsn string) error {
	if err := checkUserInfo(dsn); err != nil {
		return err
	}
	_, err := pgxpool.ParseConfig(dsn)
	return RedactError(err, dsn)
}

// checkUserInfo refuses a URL DSN whose password holds an '@' not
// percent-encoded. The driver, as libpq does, ends the user info at the
// first '@', so the rest of such a password would be taken for the host:
// the DSN passed the check, then every connection failed naming that
// host, part of the password in the error (an outside review). A '@' in
// the query, after the host, is left alone.
func checkUserInfo(dsn string) error {
	rest, ok := strings.CutPrefix(dsn, "postgresql://")
	if !ok {
		if rest, ok = strings.CutPrefix(dsn, "postgres://"); !ok {
			return nil
		}
	}
	i := strings.IndexAny(rest, "@/")
	if i < 0 || rest[i] != '@' {
		return nil
	}
	host := rest[i+1:]
	if j := strings.IndexAny(host, "/?"); j >= 0 {
		host = host[:j]
	}
	if strings.Contains(host, "@") {
		return errors.New("the user info holds an '@' that is not percent-encoded: the driver ends the user info at the first '@' and would read the rest of the password as the host (write '@' as %40)")
	}
	return nil
}

// scrub removes every password of dsn, raw or URL-decoded, from msg.
func scrub(msg, dsn string) string {
	for _, s := range passwordSpans(dsn) {
		secret := dsn[s.start:s.end]
		for _, v := range []string{secret, strings.Trim(secret, "'"), unescape(secret)} {
			if v != "" {
				msg = strings.ReplaceAll(msg, v, mask)
			}
		}
	}
	return msg
}

func unescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}
