// Package schedule turns a job's cron spec and time zone into run instants.
// Instants are a pure function of the spec and a point in time: replicas that
// started at different moments, or restarted, name the same runs.
package schedule

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// parser accepts what cron users already write: five fields, an optional
// leading seconds field, and the @yearly…@hourly descriptors. @every is
// handled here, not by the library, because the library anchors it at the
// moment of the call, which differs between replicas.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour |
	cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// MinEvery is the shortest @every interval.
const MinEvery = time.Second

// Schedule yields the instants of one job.
type Schedule struct {
	spec  string
	loc   *time.Location
	cron  cron.Schedule // nil for @every
	every time.Duration
}

// Parse parses spec in the IANA zone tz ("" means UTC).
func Parse(spec, tz string) (*Schedule, error) {
	loc := time.UTC
	if tz != "" {
		l, err := time.LoadLocation(tz)
		if err != nil {
			return nil, fmt.Errorf("unknown time zone %q", tz)
		}
		loc = l
	}
	spec = strings.TrimSpace(spec)
	s := &Schedule{spec: spec, loc: loc}
	switch {
	case spec == "":
		return nil, errors.New("empty schedule")
	case strings.HasPrefix(spec, "@every"):
		d, err := time.ParseDuration(strings.TrimSpace(strings.TrimPrefix(spec, "@every")))
		if err != nil {
			return nil, fmt.Errorf("schedule %q: %v", spec, err)
		}
		if d < MinEvery || d%time.Second != 0 {
			return nil, fmt.Errorf("schedule %q: @every needs a whole number of seconds, at least %v", spec, MinEvery)
		}
		s.every = d
	case strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ="):
		return nil, fmt.Errorf("schedule %q: set the zone with the job's timezone key, not in the spec", spec)
	default:
		c, err := parser.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("schedule %q: %v", spec, err)
		}
		c.(*cron.SpecSchedule).Location = loc
		s.cron = c
	}
	if s.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("schedule %q never fires", spec)
	}
	return s, nil
}

// String is the spec as written.
func (s *Schedule) String() string { return s.spec }

// Location is the zone wall-clock specs fire in.
func (s *Schedule) Location() *time.Location { return s.loc }

// Next returns the first instant strictly after t, in UTC, or the zero time
// if the schedule never fires again. @every instants are multiples of the
// interval since the Unix epoch, so they do not depend on when a replica
// started.
func (s *Schedule) Next(t time.Time) time.Time {
	if s.every > 0 {
		n := t.UnixNano()
		d := s.every.Nanoseconds()
		k := n / d
		if n < 0 && n%d != 0 {
			k-- // floor, not truncation, before the epoch
		}
		if k+1 > math.MaxInt64/d {
			// Beyond what a time.Duration since the epoch holds (year
			// 2262): no later instant can be named.
			return time.Time{}
		}
		return time.Unix(0, (k+1)*d).UTC()
	}
	n := s.cron.Next(t)
	if !n.IsZero() && s.fixedHours() && repeatedWallTime(n.In(s.loc)) {
		// Like Vixie cron, a job pinned to an hour fires once when the
		// clocks fall back, on the first of the two identical wall times.
		n = s.cron.Next(n)
	}
	if s.fixedHours() {
		// Like Vixie cron too, a job pinned to a wall time that the clocks
		// spring over fires once, at the transition, instead of not at all
		// that day (the library skips it: a nightly run would be lost).
		if g := s.springGap(t, n); !g.IsZero() {
			n = g
		}
	}
	return n.UTC()
}

// springGap returns the first spring-forward transition after t and
// before n (n zero: within a year) at which the spec names a wall time
// the clocks skip, or the zero time.
func (s *Schedule) springGap(t, n time.Time) time.Time {
	spec, ok := s.cron.(*cron.SpecSchedule)
	if !ok || s.loc == time.UTC {
		return time.Time{}
	}
	if n.IsZero() {
		n = t.AddDate(1, 0, 0)
	}
	naive := *spec
	naive.Location = time.UTC // the spec on a wall clock that never jumps
	_, off := t.In(s.loc).Zone()
	for h := t.Truncate(time.Hour).Add(time.Hour); h.Before(n.Add(time.Hour)); h = h.Add(time.Hour) {
		_, next := h.In(s.loc).Zone()
		if next <= off {
			off = next
			continue
		}
		// The offset grew by next-off within the hour before h: find the
		// transition to the second, and the wall times it skips.
		lo, hi := h.Add(-time.Hour).Unix(), h.Unix() // whole seconds, as instants are
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			if _, o := time.Unix(mid, 0).In(s.loc).Zone(); o == off {
				lo = mid
			} else {
				hi = mid
			}
		}
		wall := func(x time.Time, offset int) time.Time {
			return x.Add(time.Duration(offset) * time.Second).UTC()
		}
		at := time.Unix(hi, 0)
		from, to := wall(at, off), wall(at, next) // [from, to) never shows on the clock
		if w := naive.Next(from.Add(-time.Second)); w.Before(to) && at.After(t) && at.Before(n) {
			return at
		}
		off = next
	}
	return time.Time{}
}

// fixedHours reports whether the spec names its hours (not "*"), so that a
// repeated wall-clock hour must not fire it twice.
func (s *Schedule) fixedHours() bool {
	spec, ok := s.cron.(*cron.SpecSchedule)
	return ok && spec.Hour&(1<<63) == 0 // robfig's starBit marks "*"
}

// repeatedWallTime reports whether n's wall-clock time already happened
// earlier because the zone's offset fell back just before n.
func repeatedWallTime(n time.Time) bool {
	_, before := n.Add(-3 * time.Hour).Zone()
	_, now := n.Zone()
	if before <= now {
		return false
	}
	m := n.Add(-time.Duration(before-now) * time.Second)
	return m.Format("2006-01-02 15:04:05") == n.Format("2006-01-02 15:04:05")
}

// Prev returns the last instant at or before t, or the zero time if there is
// none within limit before t.
func (s *Schedule) Prev(t time.Time, limit time.Duration) time.Time {
	if s.every > 0 {
		p := s.Next(t.Add(-s.every))
		if t.Sub(p) > limit {
			return time.Time{}
		}
		return p
	}
	// Widen the window until it holds an instant, then walk forward. The
	// walk visits few instants because the window at most doubles past the
	// first one it contains.
	for back := time.Second; ; back *= 2 {
		if back > limit {
			back = limit
		}
		from := t.Add(-back)
		if n := s.Next(from.Add(-time.Nanosecond)); !n.IsZero() && !n.After(t) {
			last := n
			for {
				n = s.Next(n)
				if n.IsZero() || n.After(t) {
					return last
				}
				last = n
			}
		}
		if back == limit {
			return time.Time{}
		}
	}
}

// Period estimates the interval between instants around t; used to size
// standby windows and done-marker lifetimes, never to name a run.
func (s *Schedule) Period(t time.Time) time.Duration {
	if s.every > 0 {
		return s.every
	}
	a := s.Next(t)
	b := s.Next(a)
	if a.IsZero() || b.IsZero() {
		return 0
	}
	return b.Sub(a)
}
