package schedule

import (
	"sort"
	"strings"
	"testing"
	"time"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestNext(t *testing.T) {
	cases := []struct {
		name, spec, tz, from string
		want                 []string
	}{
		{"FiveFields", "30 2 * * *", "", "2026-03-01T00:00:00Z",
			[]string{"2026-03-01T02:30:00Z", "2026-03-02T02:30:00Z"}},
		{"SixFieldsWithSeconds", "*/20 * * * * *", "", "2026-03-01T00:00:05.5Z",
			[]string{"2026-03-01T00:00:20Z", "2026-03-01T00:00:40Z", "2026-03-01T00:01:00Z"}},
		{"Hourly", "@hourly", "", "2026-03-01T00:59:59Z",
			[]string{"2026-03-01T01:00:00Z", "2026-03-01T02:00:00Z"}},
		{"Daily", "@daily", "", "2026-03-01T00:00:00Z",
			[]string{"2026-03-02T00:00:00Z"}},
		{"Weekly", "@weekly", "", "2026-03-01T00:00:00Z", // a Sunday
			[]string{"2026-03-08T00:00:00Z"}},
		{"Monthly", "@monthly", "", "2026-03-01T00:00:00Z",
			[]string{"2026-04-01T00:00:00Z"}},
		{"Yearly", "@yearly", "", "2026-03-01T00:00:00Z",
			[]string{"2027-01-01T00:00:00Z"}},
		{"EveryIsEpochAnchored", "@every 90s", "", "2026-03-01T00:00:01Z",
			[]string{"2026-03-01T00:01:30Z", "2026-03-01T00:03:00Z"}},
		{"ZoneShiftsWallClock", "0 9 * * *", "Europe/Berlin", "2026-01-10T00:00:00Z",
			[]string{"2026-01-10T08:00:00Z", "2026-01-11T08:00:00Z"}},
		// Berlin springs forward on 2026-03-29: 09:00 local moves from 08:00Z to 07:00Z.
		{"AcrossSpringForward", "0 9 * * *", "Europe/Berlin", "2026-03-28T00:00:00Z",
			[]string{"2026-03-28T08:00:00Z", "2026-03-29T07:00:00Z"}},
		// New York falls back on 2026-11-01: 01:30 local happens twice; cron fires once.
		// crontab(5): "0 or 7 is Sun". 2026-03-01 is a Sunday.
		{"SevenIsSunday", "0 0 * * 7", "", "2026-02-26T00:00:00Z",
			[]string{"2026-03-01T00:00:00Z", "2026-03-08T00:00:00Z"}},
		{"ARangeToSevenEndsOnSunday", "0 0 * * 5-7", "", "2026-02-26T00:00:00Z", // a Thursday
			[]string{"2026-02-27T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-01T00:00:00Z", "2026-03-06T00:00:00Z"}},
		{"ASteppedRangeToSeven", "0 0 * * 1-7/3,3", "", "2026-02-28T00:00:00Z", // Mon, Wed, Thu, Sun
			[]string{"2026-03-01T00:00:00Z", "2026-03-02T00:00:00Z", "2026-03-04T00:00:00Z", "2026-03-05T00:00:00Z", "2026-03-08T00:00:00Z"}},
		{"ZeroToSevenIsEveryDay", "0 12 * * 0-7", "", "2026-02-28T13:00:00Z",
			[]string{"2026-03-01T12:00:00Z", "2026-03-02T12:00:00Z"}},
		{"SevenWithSeconds", "30 0 0 * * 7", "", "2026-02-26T00:00:00Z",
			[]string{"2026-03-01T00:00:30Z"}},
		{"AcrossFallBack", "30 1 * * *", "America/New_York", "2026-10-31T00:00:00Z",
			[]string{"2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.spec, tc.tz)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			at := mustTime(t, tc.from)
			for _, w := range tc.want {
				at = s.Next(at)
				if !at.Equal(mustTime(t, w)) || at.Location() != time.UTC {
					t.Fatalf("next = %v, want %s in UTC", at, w)
				}
			}
		})
	}
}

// The DST rule, in three zones: a wall time the clocks spring over fires
// once, at the transition (the library alone skips that day: a lost
// nightly run); a wall time the clocks repeat fires once, the first time;
// specs that do not pin the hour, and @every, keep their cadence.
func TestDaylightSavingTransitions(t *testing.T) {
	cases := []struct {
		name, spec, tz, from string
		want                 []string // wall times in the zone
	}{
		{"NewYorkSpringGap", "30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08 03:00 EDT", "2026-03-09 02:30 EDT"}},
		{"NewYorkSpringGapHourStart", "0 2 * * *", "America/New_York", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08 03:00 EDT", "2026-03-09 02:00 EDT"}},
		{"NewYorkJustAfterGap", "0 3 * * *", "America/New_York", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08 03:00 EDT", "2026-03-09 03:00 EDT"}},
		{"NewYorkAutumnRepeat", "30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z",
			[]string{"2026-11-01 01:30 EDT", "2026-11-02 01:30 EST"}},
		{"BerlinSpringGap", "30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z",
			[]string{"2026-03-29 03:00 CEST", "2026-03-30 02:30 CEST"}},
		{"BerlinAutumnRepeat", "30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z",
			[]string{"2026-10-25 02:30 CEST", "2026-10-26 02:30 CET"}},
		{"SydneySpringGap", "30 2 * * *", "Australia/Sydney", "2026-10-03T00:00:00Z",
			[]string{"2026-10-04 03:00 AEDT", "2026-10-05 02:30 AEDT"}},
		{"SydneyAutumnRepeat", "30 2 * * *", "Australia/Sydney", "2026-04-03T00:00:00Z",
			[]string{"2026-04-04 02:30 AEDT", "2026-04-05 02:30 AEDT", "2026-04-06 02:30 AEST"}},
		{"EveryFifteenMinutesThroughTheGap", "*/15 * * * *", "America/New_York", "2026-03-08T06:40:00Z",
			[]string{"2026-03-08 01:45 EST", "2026-03-08 03:00 EDT", "2026-03-08 03:15 EDT"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.spec, tc.tz)
			if err != nil {
				t.Fatal(err)
			}
			at := mustTime(t, tc.from)
			for _, w := range tc.want {
				at = s.Next(at)
				if got := at.In(s.Location()).Format("2006-01-02 15:04 MST"); got != w || at.Nanosecond() != 0 {
					t.Fatalf("next = %s (%s), want %s", got, at.Format(time.RFC3339Nano), w)
				}
			}
		})
	}
	// @every is anchored to the epoch: its cadence never sees the clocks.
	for _, tz := range []string{"America/New_York", "Europe/Berlin", "Australia/Sydney"} {
		s, err := Parse("@every 10m", tz)
		if err != nil {
			t.Fatal(err)
		}
		for _, from := range []string{"2026-03-08T05:00:00Z", "2026-11-01T04:00:00Z", "2026-03-29T00:00:00Z", "2026-10-03T15:00:00Z"} {
			at := mustTime(t, from)
			for range 20 {
				next := s.Next(at)
				if d := next.Sub(at); d != 10*time.Minute { // every from is on a 10m boundary
					t.Fatalf("%s from %s: step %v, want 10m", tz, at, d)
				}
				at = next
			}
		}
	}
	// Prev agrees with Next across the gap.
	s, _ := Parse("30 2 * * *", "America/New_York")
	if p := s.Prev(mustTime(t, "2026-03-08T08:00:00Z"), 24*time.Hour); !p.Equal(mustTime(t, "2026-03-08T07:00:00Z")) {
		t.Fatalf("prev across the spring gap = %s, want the transition", p)
	}
}

func TestInstantsDoNotDependOnWhenAReplicaAsks(t *testing.T) {
	for _, spec := range []string{"@every 7s", "*/3 * * * * *", "@every 1h"} {
		s, err := Parse(spec, "")
		if err != nil {
			t.Fatal(err)
		}
		start := mustTime(t, "2026-05-05T10:00:00Z")
		want := s.Next(start)
		// Replicas asking at any moment before the instant name the same one.
		for off := time.Duration(0); start.Add(off).Before(want); off += 137 * time.Millisecond {
			if got := s.Next(start.Add(off)); !got.Equal(want) {
				t.Fatalf("%s: asked at +%v got %v, want %v", spec, off, got, want)
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ spec, tz, want string }{
		{"", "", "empty schedule"},
		{"* * *", "", "expected"},
		{"61 * * * *", "", "above maximum"},
		{"@every banana", "", "invalid duration"},
		{"@every 500ms", "", "whole number of seconds"},
		{"@every -5s", "", "at least"},
		{"@fortnightly", "", "unrecognized descriptor"},
		{"0 0 30 2 *", "", "never fires"},
		{"* * * * *", "Mars/Olympus", "unknown time zone"},
		{"CRON_TZ=UTC * * * * *", "", "timezone key"},
		{"0 0 * * 8", "", "above maximum"},
		{"0 0 * * 6-8", "", "above maximum"},
		{"0 0 * * 7-1", "", "beyond end of range"},
	}
	for _, tc := range cases {
		_, err := Parse(tc.spec, tc.tz)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q, %q) = %v, want error containing %q", tc.spec, tc.tz, err, tc.want)
		}
	}
}

func TestPrev(t *testing.T) {
	cases := []struct {
		spec, at string
		limit    time.Duration
		want     string // "" for none
	}{
		{"@every 10s", "2026-03-01T00:00:25Z", time.Hour, "2026-03-01T00:00:20Z"},
		{"@every 10s", "2026-03-01T00:00:20Z", time.Hour, "2026-03-01T00:00:20Z"},
		{"@every 10s", "2026-03-01T00:00:25Z", 4 * time.Second, ""},
		{"30 2 * * *", "2026-03-05T12:00:00Z", 48 * time.Hour, "2026-03-05T02:30:00Z"},
		{"30 2 * * *", "2026-03-05T02:30:00Z", 48 * time.Hour, "2026-03-05T02:30:00Z"},
		{"30 2 * * *", "2026-03-05T12:00:00Z", time.Hour, ""},
		{"* * * * * *", "2026-03-05T12:00:00.7Z", time.Minute, "2026-03-05T12:00:00Z"},
	}
	for _, tc := range cases {
		s, err := Parse(tc.spec, "")
		if err != nil {
			t.Fatal(err)
		}
		got := s.Prev(mustTime(t, tc.at), tc.limit)
		if tc.want == "" {
			if !got.IsZero() {
				t.Errorf("%s Prev(%s, %v) = %v, want none", tc.spec, tc.at, tc.limit, got)
			}
			continue
		}
		if !got.Equal(mustTime(t, tc.want)) {
			t.Errorf("%s Prev(%s, %v) = %v, want %s", tc.spec, tc.at, tc.limit, got, tc.want)
		}
	}
}

func FuzzNext(f *testing.F) {
	for _, s := range []string{"* * * * *", "*/5 * * * * *", "@every 90s", "@daily", "0 0 29 2 *", "30 2 * * 1-5", "@every 1s", "0 */7 * * *"} {
		f.Add(s, "Europe/Berlin", int64(1_780_000_000))
	}
	f.Fuzz(func(t *testing.T, spec, tz string, unix int64) {
		if tz != "" && tz != "UTC" && tz != "Europe/Berlin" && tz != "America/New_York" {
			tz = "UTC" // zone names are not what is being fuzzed
		}
		s, err := Parse(spec, tz)
		if err != nil {
			return
		}
		at := time.Unix(unix%4_000_000_000, 0).UTC()
		for range 5 {
			n := s.Next(at)
			if n.IsZero() {
				return
			}
			if !n.After(at) {
				t.Fatalf("%q: Next(%v) = %v, not strictly later", spec, at, n)
			}
			if p := s.Prev(n, 400*24*time.Hour); !p.Equal(n) {
				t.Fatalf("%q: Prev(Next) = %v, want %v", spec, p, n)
			}
			at = n
		}
	})
}

// Jitter is the same for a (job, instant) wherever it is computed, stays
// within the jitter and before the next instant, and spreads instants
// over the window.
func TestJitteredIsDeterministicBoundedAndSpread(t *testing.T) {
	hourly, err := Parse("@hourly", "")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if got := hourly.Jittered("billing", at, 0); !got.Equal(at) {
		t.Errorf("no jitter moved the start to %v", got)
	}
	var first, last time.Duration = time.Hour, 0
	for i := range 200 {
		a := at.Add(time.Duration(i) * time.Hour)
		got := hourly.Jittered("billing", a, 5*time.Minute)
		if again := hourly.Jittered("billing", a.In(time.FixedZone("X", 3600)), 5*time.Minute); !again.Equal(got) {
			t.Fatalf("%v: %v, then %v from another zone's reading", a, got, again)
		}
		off := got.Sub(a)
		if off < 0 || off >= 5*time.Minute {
			t.Fatalf("%v: offset %v outside [0, 5m)", a, off)
		}
		first, last = min(first, off), max(last, off)
	}
	if first > 30*time.Second || last < 4*time.Minute+30*time.Second {
		t.Errorf("200 instants jittered within [%v, %v], want spread over [0, 5m)", first, last)
	}
	if a, b := hourly.Jittered("a", at, time.Hour), hourly.Jittered("b", at, time.Hour); a.Equal(b) {
		t.Errorf("jobs a and b start at one moment %v", a)
	}
	// A jitter wider than the period stays before the next instant.
	every, err := Parse("@every 10s", "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		a := at.Add(time.Duration(i) * 10 * time.Second)
		if off := every.Jittered("tick", a, time.Hour).Sub(a); off < 0 || off >= 10*time.Second {
			t.Fatalf("%v: offset %v reaches the next instant 10s later", a, off)
		}
	}
}

// TestInstantsAroundEveryTransitionAreOneSet: around every offset change
// of 2025–2027 in zones with odd transitions (half-hour and two-hour
// shifts, 02:45 and midnight changes, Chatham's 03:00 that the clocks
// skip), Next asked at any moment names the first instant of the one
// sequence that stepping from long before gives, always after the moment
// asked; a spec that names its hours fires at most once per wall time and
// at least once on every local day it names.
func TestInstantsAroundEveryTransitionAreOneSet(t *testing.T) {
	zones := []string{"Europe/Berlin", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe",
		"Pacific/Chatham", "Antarctica/Troll", "Africa/Casablanca", "America/Santiago", "America/Havana",
		"Asia/Gaza", "Pacific/Apia", "America/St_Johns"}
	specs := []string{"0,30 2 * * *", "*/15 2 * * *", "0 0 * * *", "0 3 * * *", "30 2 * * *", "45 2 * * *",
		"*/15 * * * *", "0 * * * *", "30 1 * * *", "0 1,2,3 * * *", "0 0 * * 0"}
	from, until := mustTime(t, "2025-01-01T00:00:00Z"), mustTime(t, "2028-01-01T00:00:00Z")
	for _, tz := range zones {
		loc, err := time.LoadLocation(tz)
		if err != nil {
			t.Fatal(err)
		}
		var transitions []time.Time
		for at := from; ; {
			_, end := at.In(loc).ZoneBounds()
			if end.IsZero() || end.After(until) {
				break
			}
			transitions = append(transitions, end)
			at = end
		}
		for _, spec := range specs {
			s, err := Parse(spec, tz)
			if err != nil {
				t.Fatal(err)
			}
			for _, tr := range transitions {
				// The sequence from three days before to three days after.
				var seq []time.Time
				for at := tr.Add(-72 * time.Hour); ; {
					at = s.Next(at)
					if at.IsZero() || at.After(tr.Add(72*time.Hour)) {
						break
					}
					seq = append(seq, at)
				}
				// Asked at any moment within six hours of the transition.
				for ask := tr.Add(-6 * time.Hour); ask.Before(tr.Add(6 * time.Hour)); ask = ask.Add(7*time.Minute + 13*time.Second) {
					got := s.Next(ask)
					k := sort.Search(len(seq), func(i int) bool { return seq[i].After(ask) })
					beyond := k == len(seq) && got.After(tr.Add(72*time.Hour)) // a weekly spec
					if !got.After(ask) || !beyond && (k == len(seq) || !got.Equal(seq[k])) {
						var want time.Time
						if k < len(seq) {
							want = seq[k]
						}
						t.Fatalf("%s %q asked at %s: %s, want %s (the sequence's next)", tz, spec, ask.Format(time.RFC3339),
							got.Format(time.RFC3339), want.Format(time.RFC3339))
					}
				}
				if !s.fixedHours() {
					continue
				}
				walls, days := map[string]bool{}, map[string]bool{}
				for _, at := range seq {
					w := at.In(loc).Format("2006-01-02 15:04:05")
					if walls[w] {
						t.Fatalf("%s %q around %s: wall time %s fires twice", tz, spec, tr.Format(time.RFC3339), w)
					}
					walls[w], days[w[:10]] = true, true
				}
				for d := tr.Add(-24 * time.Hour); d.Before(tr.Add(24 * time.Hour)); d = d.Add(time.Hour) {
					day := d.In(loc).Format("2006-01-02")
					naive, _ := time.Parse("2006-01-02", day)
					named := s.naive.Next(naive.Add(-time.Second))
					if named.Format("2006-01-02") == day && !days[day] {
						t.Fatalf("%s %q around %s: %s names %s, but no instant fires that day", tz, spec,
							tr.Format(time.RFC3339), day, named.Format("15:04"))
					}
				}
			}
		}
	}
}

// TestTheLastDayOfALeapYearKeepsFiring: past the zone file's last
// transition, Go's ZoneBounds reports on the last day of a leap year a
// span that ended already; Next still names the next instant, the same
// one the UTC offset gives, for daily, weekly, monthly and yearly specs
// (a reviewer found the first version of the period walk answering
// "never fires again" there: with the tzdata Go embeds, from December
// 2028).
func TestTheLastDayOfALeapYearKeepsFiring(t *testing.T) {
	for _, tz := range []string{"Europe/Berlin", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe"} {
		loc, err := time.LoadLocation(tz)
		if err != nil {
			t.Fatal(err)
		}
		for _, year := range []int{2028, 2040, 2048, 2096} {
			for _, spec := range []string{"0 9 * * *", "@weekly", "@monthly", "@yearly", "*/20 * * * *"} {
				s, err := Parse(spec, tz)
				if err != nil {
					t.Fatal(err)
				}
				for _, from := range []time.Time{
					time.Date(year, 11, 15, 0, 0, 0, 0, time.UTC), time.Date(year, 12, 25, 0, 0, 0, 0, time.UTC),
					time.Date(year, 12, 30, 12, 0, 0, 0, time.UTC), time.Date(year, 12, 31, 0, 0, 0, 0, time.UTC),
					time.Date(year, 12, 31, 12, 30, 0, 0, time.UTC),
				} {
					got := s.Next(from)
					// The spec on the wall clock of from's offset, which no
					// transition changes between November and January here
					// but Sydney's and Lord Howe's, whose next is in April.
					_, off := from.In(loc).Zone()
					w := s.naive.Next(from.Add(time.Duration(off) * time.Second))
					want := w.Add(-time.Duration(off) * time.Second)
					if !got.Equal(want) {
						t.Errorf("%s %q: Next(%s) = %s, want %s", tz, spec, from.Format(time.RFC3339), got, want)
					}
				}
			}
		}
	}
}
