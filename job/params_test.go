package job

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"testing"
	"time"
)

type retry struct {
	Max     int           `yaml:"max"`
	Backoff time.Duration `yaml:"backoff"`
}

func (r retry) Validate() error {
	if r.Max < 0 {
		return &ParamError{Key: "max", Value: fmt.Sprint(r.Max), Msg: "must not be negative"}
	}
	return nil
}

type host struct {
	Name string `yaml:"name"`
	Port uint16 `yaml:"port"`
}

type Common struct {
	Region string `yaml:"region"`
}

type testParams struct {
	Duration time.Duration `yaml:"duration"`
	Label    string        `yaml:"label"`
	Count    int8          `yaml:"count"`
	Ratio    float64       `yaml:"ratio"`
	DryRun   bool          `yaml:"dry_run"`
	Day      time.Time     `yaml:"day"`
	Level    slog.Level    `yaml:"level"` // an encoding.TextUnmarshaler
	Retry    retry         `yaml:"retry"`
	Hosts    []host        `yaml:"hosts"`
	Limits   map[string]int
	Optional *time.Duration `yaml:"optional"`
	Extra    any            `yaml:"extra"`
	APIToken string         `yaml:"api_token"`
	Ignored  string         `yaml:"-"`
	Common   `yaml:",inline"`
}

// Validate fails the whole params with a plain error, and a key with a
// *ParamError, both joined.
func (p testParams) Validate() error {
	var errs []error
	if p.Label == "reject" {
		errs = append(errs, errors.New("label reject is reserved"))
	}
	if p.Duration < 0 {
		errs = append(errs, &ParamError{Key: "duration", Value: p.Duration.String(), Msg: "must be positive"})
	}
	return errors.Join(errs...)
}

// problems lists the errors joined in err as text.
func problems(err error) []string {
	var out []string
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) {
		for _, e := range j.Unwrap() {
			out = append(out, e.Error())
		}
	} else if err != nil {
		out = append(out, err.Error())
	}
	return out
}

func TestDecodeParams(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params Params
		want   []string // the problems, in order
	}{
		{"UnknownKey", Params{"duraton": "1s"},
			[]string{`params.duraton: unknown key; want one of api_token, count, day, dry_run, duration, extra, hosts, label, level, limits, optional, ratio, region, retry`}},
		{"HiddenFieldIsUnknown", Params{"ignored": "x"}, []string{`params.ignored: unknown key; want one of api_token, count, day, dry_run, duration, extra, hosts, label, level, limits, optional, ratio, region, retry`}},
		{"BadDuration", Params{"duration": "forever"}, []string{`params.duration: "forever": want a duration such as "1s"`}},
		{"BareNumberIsNoDuration", Params{"duration": 30}, []string{`params.duration: "30": want a duration such as "1s"`}},
		{"NumberForString", Params{"label": 42}, []string{`params.label: "42": want a string`}},
		{"StringForInteger", Params{"count": "3"}, []string{`params.count: "3": want an integer`}},
		{"FloatForInteger", Params{"count": 1.5}, []string{`params.count: "1.5": want an integer`}},
		{"IntegerOutOfRange", Params{"count": 300}, []string{`params.count: "300": want an integer from -128 to 127`}},
		{"StringForBool", Params{"dry_run": "yes"}, []string{`params.dry_run: "yes": want true or false`}},
		{"StringForNumber", Params{"ratio": "half"}, []string{`params.ratio: "half": want a number`}},
		{"BadDate", Params{"day": "tomorrow"}, []string{`params.day: "tomorrow": want a date such as 2026-01-31 or a time such as 2026-01-31T02:30:00Z`}},
		{"BadText", Params{"level": "loud"}, []string{`params.level: "loud": slog: level string "loud": unknown name`}},
		{"ListForString", Params{"label": []any{"a"}}, []string{`params.label: want a string`}},
		{"ScalarForMapping", Params{"retry": 3}, []string{`params.retry: "3": want a mapping`}},
		{"ScalarForList", Params{"hosts": "a"}, []string{`params.hosts: "a": want a list`}},
		{"NestedPaths", Params{
			"retry":  map[string]any{"max": "x", "jitter": true},
			"hosts":  []any{map[string]any{"name": "a", "port": 80}, map[string]any{"name": "b", "port": -1}},
			"limits": map[string]any{"cpu": 2, "mem": "lots"},
		}, []string{
			`params.hosts[1].port: "-1": want an integer from 0 to 65535`,
			`params.limits.mem: "lots": want an integer`,
			`params.retry.jitter: unknown key; want one of backoff, max`,
			`params.retry.max: "x": want an integer`,
		}},
		{"ValidateNamesTheKey", Params{"duration": "-1s"}, []string{`params.duration: "-1s": must be positive`}},
		{"ValidateWholeAndKey", Params{"duration": "-1s", "label": "reject"},
			[]string{`params: label reject is reserved`, `params.duration: "-1s": must be positive`}},
		{"NestedValidateIsUnderItsKey", Params{"retry": map[string]any{"max": -2}}, []string{`params.retry.max: "-2": must not be negative`}},
		// Validate runs only on a struct that decoded cleanly.
		{"NoValidateAfterBadValue", Params{"duration": "-1s", "count": "x"}, []string{`params.count: "x": want an integer`}},
		{"SecretValueHidden", Params{"api_token": 123}, []string{`params.api_token: "xxxxx": want a string`}},
		{"DSNPasswordMasked", Params{"label": []any{}, "extra": "postgres://u:hunter2@h/db", "count": "postgres://u:hunter2@h/db"},
			[]string{`params.count: "postgres://u:xxxxx@h/db": want an integer`, `params.label: want a string`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p testParams
			err := tc.params.Decode(&p)
			if got := problems(err); !slices.Equal(got, tc.want) {
				t.Fatalf("Decode(%v):\n got %q\nwant %q", tc.params, got, tc.want)
			}
			var pe *ParamError
			if !errors.As(err, &pe) {
				t.Fatalf("%v is no *ParamError", err)
			}
		})
	}
}

func TestDecodeParamsFillsNestedValues(t *testing.T) {
	params := Params{
		"duration":  "1m30s",
		"label":     "nightly",
		"count":     -7,
		"ratio":     2, // an integer is a number
		"dry_run":   true,
		"day":       "2026-01-31",
		"level":     "warn",
		"retry":     map[string]any{"max": 3, "backoff": "250ms"},
		"hosts":     []any{map[string]any{"name": "a", "port": 80}, map[string]any{"name": "b"}},
		"limits":    map[string]any{"cpu": 2},
		"optional":  "2s",
		"extra":     map[string]any{"free": []any{1, "form"}},
		"region":    "eu",
		"api_token": nil, // null keeps the zero value
	}
	var p testParams
	if err := params.Decode(&p); err != nil {
		t.Fatal(err)
	}
	two := 2 * time.Second
	want := testParams{Duration: 90 * time.Second, Label: "nightly", Count: -7, Ratio: 2, DryRun: true,
		Day: time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC), Level: slog.LevelWarn,
		Retry: retry{Max: 3, Backoff: 250 * time.Millisecond}, Hosts: []host{{"a", 80}, {"b", 0}},
		Limits: map[string]int{"cpu": 2}, Optional: &two, Extra: map[string]any{"free": []any{1, "form"}},
		Common: Common{Region: "eu"}}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("decoded\n %+v\nwant\n %+v", p, want)
	}
}

func TestDecodeParamsTimes(t *testing.T) {
	at := time.Date(2026, 1, 31, 2, 30, 0, 0, time.UTC)
	for _, x := range []any{"2026-01-31T02:30:00Z", "2026-01-31 02:30:00", at} {
		var p testParams
		if err := (Params{"day": x}).Decode(&p); err != nil || !p.Day.Equal(at) {
			t.Errorf("day %v: %v, %v", x, p.Day, err)
		}
	}
	var p testParams
	if err := (Params{"duration": 0}).Decode(&p); err != nil {
		t.Errorf("duration 0: %v", err)
	}
}

func TestDecodeRejectsUndecodableTypes(t *testing.T) {
	type withChan struct{ C chan int }
	type twoKeys struct {
		A string `yaml:"x"`
		B string `yaml:"x"`
	}
	for _, v := range []any{nil, testParams{}, new(int), new(withChan), new(twoKeys), new(struct{ M map[int]string })} {
		if err := (Params{}).Decode(v); err == nil {
			t.Errorf("Decode(%T) accepted", v)
		}
	}
}

func TestRegistryChecksDeclaredParams(t *testing.T) {
	r := NewRegistry()
	var got testParams
	MustRegisterTyped(r, "typed", func(_ context.Context, run Run, p testParams) error { got = p; return nil })
	r.MustRegisterOpener("opened", func(context.Context, Resources) (Handler, func() error, error) {
		return Typed(func(context.Context, Run, retry) error { return nil }), nil, nil
	}, WithParams[retry]())
	r.MustRegister("free", ok)

	t.Run("BadValueNamesJobKeyAndValue", func(t *testing.T) {
		err := r.CheckParams("typed", Params{"duration": "forever"})
		want := `jobs.typed.params.duration: "forever": want a duration such as "1s"`
		var pe *ParamError
		if !errors.As(err, &pe) || err.Error() != want || pe.Job != "typed" || pe.ConfigKey() != "jobs.typed.params.duration" {
			t.Fatalf("CheckParams = %v, want %s", err, want)
		}
	})
	t.Run("OpenerParamsCheckedWithoutOpening", func(t *testing.T) {
		if err := r.CheckParams("opened", Params{"max": -1}); err == nil || err.Error() != `jobs.opened.params.max: "-1": must not be negative` {
			t.Fatalf("CheckParams = %v", err)
		}
		if err := r.CheckParams("opened", Params{"max": 1}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("UndeclaredAndUnknownAcceptAnything", func(t *testing.T) {
		for _, name := range []string{"free", "missing"} {
			if err := r.CheckParams(name, Params{"anything": []any{1}}); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
	t.Run("RunGetsDecodedParams", func(t *testing.T) {
		h, _ := r.Lookup("typed")
		if err := h(t.Context(), Run{Job: "typed", Params: Params{"label": "x", "retry": map[string]any{"max": 2}}}); err != nil {
			t.Fatal(err)
		}
		if got.Label != "x" || got.Retry.Max != 2 {
			t.Fatalf("handler got %+v", got)
		}
	})
	t.Run("RunWithBadParamsFailsBeforeTheHandler", func(t *testing.T) {
		got = testParams{}
		h, _ := r.Lookup("typed")
		err := h(t.Context(), Run{Job: "typed", Params: Params{"count": "x"}})
		if err == nil || err.Error() != `jobs.typed.params.count: "x": want an integer` || got.Count != 0 || got.Label != "" {
			t.Fatalf("run = %v, handler got %+v", err, got)
		}
	})
	t.Run("BadDeclarationsFailToRegister", func(t *testing.T) {
		if err := r.Register("bad", ok, WithParams[int]()); err == nil || r.Has("bad") {
			t.Errorf("int params registered: %v", err)
		}
		if err := RegisterTyped(r, "bad", func(context.Context, Run, struct{ F func() }) error { return nil }); err == nil {
			t.Error("func field registered")
		}
		if err := RegisterTyped[retry](r, "bad", nil); err == nil {
			t.Error("nil typed handler registered")
		}
		if err := r.Register("bad", ok, Option{}); err != nil { // the zero Option does nothing
			t.Error(err)
		}
	})
}
