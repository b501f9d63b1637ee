// Package schedule turns a job's cron spec and time zone into run instants.
// Instants are a pure function of the spec and a point in time: replicas that
// started at different moments, or restarted, name the same runs.
package schedule

import (
	"errors"
	"fmt"
	"math"
	"strconv"
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
	naive *cron.SpecSchedule // the spec on a wall clock that never jumps (UTC); nil for @every
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
		c, err := parser.Parse(sundayAsSeven(spec))
		if err != nil {
			return nil, fmt.Errorf("schedule %q: %v", spec, err)
		}
		cs, ok := c.(*cron.SpecSchedule)
		if !ok {
			return nil, fmt.Errorf("schedule %q: not a cron spec", spec)
		}
		cs.Location = time.UTC
		s.naive = cs
	}
	if s.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("schedule %q never fires", spec)
	}
	return s, nil
}

// sundayAsSeven rewrites a cron spec's day-of-week field so that 7 means
// Sunday, as crontab(5) has it ("0 or 7 is Sun") and as many crontabs
// are written (0 0 * * 7, 1-7, 5-7/2); the parser knows only 0-6. A part
// naming 7 becomes the list of days it names, 7 as 0. Anything else is
// left as it is, for the parser to accept or explain.
func sundayAsSeven(spec string) string {
	fields := strings.Fields(spec)
	if len(fields) < 5 || len(fields) > 6 {
		return spec
	}
	parts := strings.Split(fields[len(fields)-1], ",")
	changed := false
	for i, part := range parts {
		if days, ok := daysWithSeven(part); ok {
			parts[i], changed = days, true
		}
	}
	if !changed {
		return spec
	}
	fields[len(fields)-1] = strings.Join(parts, ",")
	return strings.Join(fields, " ")
}

// daysWithSeven lists the days of one day-of-week part (n, n-m, n-m/s)
// that names 7, with 7 written 0; ok is false for any other part.
func daysWithSeven(part string) (string, bool) {
	rng, stepText, stepped := strings.Cut(part, "/")
	loText, hiText, isRange := strings.Cut(rng, "-")
	if !isRange {
		if loText != "7" || stepped {
			return "", false
		}
		return "0", true
	}
	lo, err1 := strconv.Atoi(loText)
	hi, err2 := strconv.Atoi(hiText)
	step := 1
	var err3 error
	if stepped {
		step, err3 = strconv.Atoi(stepText)
	}
	if err1 != nil || err2 != nil || err3 != nil || hi != 7 || lo < 0 || lo > hi || step < 1 {
		return "", false
	}
	seen := map[int]bool{}
	var days []string
	for d := lo; d <= hi; d += step {
		if d%7 == 0 && seen[0] {
			continue
		}
		seen[d%7] = true
		days = append(days, strconv.Itoa(d%7))
	}
	return strings.Join(days, ","), true
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
	return s.nextWall(t)
}

// maxPeriods bounds the zone periods (spans of one UTC offset) Next walks
// before it gives up: a spec that fires at all fires within a few years
// (the cron library searches five), a zone changes its offset about twice
// a year, and the last day of a leap year may go by the hour (see
// nextWall): 5 × (2 + 24) periods, and some to spare.
const maxPeriods = 256

// nextWall is Next for a cron spec. The instants are defined period by
// period, where a period is a span of one UTC offset in the job's zone:
// within one, the wall clock runs evenly, so its instants are the wall
// times the spec names, each minus the offset. Between periods, like
// Vixie cron, a spec that names its hours fires once for the wall times
// the clocks spring over (at the transition, rather than not at all that
// day: a nightly run would be lost) and once for the wall times they
// repeat (the first time); a spec that does not name its hours keeps its
// cadence: the skipped times do not fire, the repeated ones fire twice.
// The spec itself is only ever asked in UTC (a wall clock that never
// jumps): the library's own zone arithmetic disagrees with itself around
// some transitions, depending on the moment asked (an hour repeated
// twice on one autumn night, a Chatham Islands instant before the time
// asked, a Lord Howe midnight skipped), and the set of instants must not
// depend on when a replica asks.
func (s *Schedule) nextWall(t time.Time) time.Time {
	wall := func(x time.Time, offset int) time.Time { // x's wall time at offset, as a UTC time
		return x.Add(time.Duration(offset) * time.Second).UTC()
	}
	at := t.In(s.loc)
	for range maxPeriods {
		_, off := at.Zone()
		start, end := at.ZoneBounds()
		if !end.IsZero() && !end.After(at) {
			// Past the zone file's last transition, where the zone's
			// recurring rule applies, Go reports on the last day of a leap
			// year a span that has already ended (its year is 365 days
			// long). The offsets Zone reports stay right: step an hour,
			// and a boundary without a change of offset changes nothing.
			end = at.Truncate(time.Hour).Add(time.Hour)
		}
		if start.After(at) {
			start = at // not seen, but a span must hold at
		}
		prev := off
		if !start.IsZero() {
			_, prev = start.Add(-time.Nanosecond).In(s.loc).Zone()
		}
		if s.fixedHours() && off > prev && start.After(t) {
			// The clocks sprang over [start+prev, start+off) at start.
			if w := s.naive.Next(wall(start, prev).Add(-time.Second)); !w.IsZero() && w.Before(wall(start, off)) {
				return start.UTC()
			}
		}
		// The first wall time after t in this period, and not one the
		// period before showed already (a spec that names its hours).
		from := wall(t, off)
		if !start.IsZero() {
			first := wall(start, off)
			if s.fixedHours() && prev > off {
				first = wall(start, prev)
			}
			if f := first.Add(-time.Second); f.After(from) {
				from = f
			}
		}
		w := s.naive.Next(from)
		if w.IsZero() {
			return time.Time{} // the spec never fires again
		}
		if end.IsZero() || w.Before(wall(end, off)) {
			return w.Add(-time.Duration(off) * time.Second)
		}
		at = end.In(s.loc)
	}
	return time.Time{}
}

// fixedHours reports whether the spec names its hours (not "*"), so that a
// repeated wall-clock hour must not fire it twice.
func (s *Schedule) fixedHours() bool {
	return s.naive != nil && s.naive.Hour&(1<<63) == 0 // robfig's starBit marks "*"
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
