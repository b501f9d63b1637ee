package redisnode

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// Controls (claim.Controls) live beside the runs, in the same Redis, so
// that the operator's pauses and run requests reach every replica through
// the store the replicas already share. A namespace keeps all of them in
// one hash, <prefix>controls: field the control's key, value one encoded
// entry. DropPrefix deletes it with the rest of the namespace.
//
// An entry is a fixed 42-byte header followed by the value's raw bytes
// (Redis strings and Lua strings are binary-safe, so values may hold NUL
// and invalid UTF-8):
//
//	VVVVVVVVVVVVVVVVVVV:F:EEEEEEEEEEEEEEEEEEE:<value>
//
// V is the version, F "1" for First and "0" otherwise, E the expiry in
// unix nanoseconds (0: never), each 19 zero-padded decimal digits.
// Nanoseconds since 1970 do not fit a Lua number (a double, exact below
// 2^53), so the scripts compare these fields as two exact halves: the
// first 10 digits (the seconds, for a time) and the last 9.
const (
	digits      = 19
	headerLen   = 2*digits + 4
	versionEnd  = digits     // version: [0, versionEnd)
	firstAt     = digits + 1 // "0" or "1"
	expiresFrom = digits + 3 // expires: [expiresFrom, expiresFrom+digits)
	never       = "0000000000000000000"
)

// controlsLua is the prelude of the control scripts: live(e) tells whether
// entry e is well formed and unexpired on the server's clock, less(a, b)
// compares two 19-digit fields exactly. A malformed entry counts as
// absent, as an expired one does.
const controlsLua = `
local D = string.rep('%d', 19)
local HEAD = '^' .. D .. ':[01]:' .. D .. ':'
local function halves(d) return tonumber(string.sub(d, 1, 10)), tonumber(string.sub(d, 11, 19)) end
local function less(a, b)
  local ah, al = halves(a)
  local bh, bl = halves(b)
  return ah < bh or (ah == bh and al < bl)
end
local t = redis.call('TIME')
local now = string.format('%010d%09d', tonumber(t[1]), tonumber(t[2]) * 1000)
local function live(e)
  if not e or not string.find(e, HEAD) then return false end
  local x = string.sub(e, 23, 41)
  return x == '` + never + `' or less(now, x)
end
`

// putControlScript stores entries, each unless its field holds a live one
// that it does not win over (claim.Control.Wins: a First entry never
// replaces a live one, whatever its version; any other replaces it with a
// higher version; a tie keeps the stored one), and returns the entry each
// field holds afterwards. An expired or malformed entry is overwritten,
// which is how expired fields met here are dropped. One call stores a
// batch (at most scriptRuns entries), each decided on its own, in order.
//
// KEYS: controls hash. ARGV: per entry: field, encoded entry.
// Reply: per entry, the encoded entry stored afterwards.
var putControlScript = goredis.NewScript(controlsLua + `
local function put(field, new)
  local cur = redis.call('HGET', KEYS[1], field)
  if cur and live(cur) then
    local first = string.sub(new, 21, 21) == '1'
    if first or not less(string.sub(cur, 1, 19), string.sub(new, 1, 19)) then return cur end
  end
  redis.call('HSET', KEYS[1], field, new)
  return new
end
local out = {}
for i = 1, #ARGV, 2 do
  out[#out + 1] = put(ARGV[i], ARGV[i + 1])
end
return out
`)

// listControlsScript returns the live entries whose fields start with any
// of the prefixes, and drops every expired or malformed field it meets.
// It walks the whole hash, so a replica reads all the kinds it honours in
// one call (claim.PrefixLister), not one walk per kind.
//
// KEYS: controls hash. ARGV: the prefixes.
// Reply: field, entry, field, entry, ... in no order.
var listControlsScript = goredis.NewScript(controlsLua + `
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local k, e = all[i], all[i + 1]
  if not live(e) then
    redis.call('HDEL', KEYS[1], k)
  else
    for _, p in ipairs(ARGV) do
      if string.sub(k, 1, #p) == p then
        out[#out + 1] = k
        out[#out + 1] = e
        break
      end
    end
  end
end
return out
`)

// PutControl runs the put script on the node: c is stored unless the key
// holds an unexpired entry (on the server's clock) that wins over it, and
// the entry the key holds afterwards is returned. c must have passed
// claim.CheckControl.
func (n *Node) PutControl(ctx context.Context, c claim.Control) (claim.Control, error) {
	got, errs := n.PutControls(ctx, []claim.Control{c})
	return got[0], errs[0]
}

// PutControls stores each of cs as PutControl would, each decided on its
// own, a hundred to a script call, in one pipeline: one round trip
// whatever their number.
func (n *Node) PutControls(ctx context.Context, cs []claim.Control) ([]claim.Control, []error) {
	got := make([]claim.Control, len(cs))
	answers := make([]error, len(cs))
	// The controls hash is one key, outside the buckets: every entry's
	// "job" is the same, so chunks only caps the calls' size.
	errs := n.batch(ctx, putControlProgram, len(cs), func(int) string { return "" },
		func(int) ([]string, []any) { return []string{n.keys.controls()}, nil },
		func(i int, keys []string, args []any) ([]string, []any) {
			return keys, append(args, cs[i].Key, encodeControl(cs[i]))
		}, func(_ int, chunk []int, vals []any) error {
			if len(vals) != len(chunk) {
				return fmt.Errorf("redis: put control script replied %d entries to %d", len(vals), len(chunk))
			}
			for k, i := range chunk {
				v, ok := vals[k].(string)
				if !ok {
					answers[i] = fmt.Errorf("redis: put control script replied %v for %q", vals[k], cs[i].Key)
					continue
				}
				got[i], answers[i] = decodeControl(cs[i].Key, v)
			}
			return nil
		})
	for i, err := range errs {
		if err == nil {
			errs[i] = answers[i]
		}
	}
	return got, errs
}

// ListControls returns the node's unexpired entries whose keys start with
// any of prefixes, each once, sorted by key.
func (n *Node) ListControls(ctx context.Context, prefixes ...string) ([]claim.Control, error) {
	if len(prefixes) == 0 {
		return nil, nil
	}
	args := make([]any, len(prefixes))
	for i, p := range prefixes {
		args[i] = p
	}
	vals, err := listControlsScript.Run(ctx, n.client, []string{n.keys.controls()}, args...).StringSlice()
	if err != nil {
		return nil, n.translate(ctx, err)
	}
	if len(vals)%2 != 0 {
		return nil, fmt.Errorf("redis: list controls script replied %d elements", len(vals))
	}
	out := make([]claim.Control, 0, len(vals)/2)
	for i := 0; i < len(vals); i += 2 {
		c, err := decodeControl(vals[i], vals[i+1])
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b claim.Control) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// encodeControl is c's entry: the header, then the value's bytes.
func encodeControl(c claim.Control) string {
	first := 0
	if c.First {
		first = 1
	}
	var b strings.Builder
	b.Grow(headerLen + len(c.Value))
	fmt.Fprintf(&b, "%0*d:%d:%0*d:", digits, c.Version, first, digits, expiresNanos(c.Expires))
	b.Write(c.Value)
	return b.String()
}

// expiresNanos is t in unix nanoseconds, 0 for the zero time; a time
// outside what int64 nanoseconds hold is clamped (to 1 before 1970: long
// expired).
func expiresNanos(t time.Time) int64 {
	switch {
	case t.IsZero():
		return 0
	case !t.After(time.Unix(0, 0)):
		return 1
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

func decodeControl(key, e string) (claim.Control, error) {
	bad := func() (claim.Control, error) {
		return claim.Control{}, fmt.Errorf("redis: control %q: malformed entry %.60q", key, e)
	}
	if len(e) < headerLen || e[versionEnd] != ':' || e[firstAt+1] != ':' || e[headerLen-1] != ':' {
		return bad()
	}
	version, err := strconv.ParseInt(e[:versionEnd], 10, 64)
	if err != nil {
		return bad()
	}
	expires, err := strconv.ParseInt(e[expiresFrom:headerLen-1], 10, 64)
	if err != nil {
		return bad()
	}
	c := claim.Control{Key: key, Value: []byte(e[headerLen:]), Version: version, First: e[firstAt] == '1'}
	if expires != 0 {
		c.Expires = time.Unix(0, expires).UTC()
	}
	return c, nil
}
