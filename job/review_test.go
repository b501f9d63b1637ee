package job

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// Secrets under a secret's name, at any depth, are hidden in params
// errors, as config hides them: credentials.pass and secrets.db were
// shown (an outside review), and so was an Authorization header.
func TestParamErrorsHideSecretsAtAnyDepth(t *testing.T) {
	type creds struct {
		Pass int `yaml:"pass"`
	}
	type params struct {
		Credentials creds             `yaml:"credentials"`
		Secrets     map[string]int    `yaml:"secrets"`
		Headers     map[string]int    `yaml:"headers"`
		Plain       map[string]int    `yaml:"plain"`
		List        []map[string]int  `yaml:"list"`
		Other       map[string]string `yaml:"other"`
	}
	r := NewRegistry()
	MustRegisterTyped(r, "p", func(context.Context, Run, params) error { return nil })
	err := r.CheckParams("p", Params{
		"credentials": map[string]any{"pass": "hunter2"},
		"secrets":     map[string]any{"db": "s3cr3t-pw"},
		"headers":     map[string]any{"Authorization": "Bearer sk-live-abc"},
		"list":        []any{map[string]any{"api_key": "k-123"}},
		"plain":       map[string]any{"n": "visible"},
	})
	text := err.Error()
	for _, secret := range []string{"hunter2", "s3cr3t-pw", "sk-live-abc", "k-123"} {
		if strings.Contains(text, secret) {
			t.Errorf("params errors show %q:\n%s", secret, text)
		}
	}
	if !strings.Contains(text, `jobs.p.params.plain.n: "visible": want an integer`) {
		t.Errorf("params errors hide a value that is no secret's:\n%s", text)
	}
}

type panicky struct{}

func (panicky) Validate() error { panic("a bug in Validate") }

// A params Validate that panics is a params error of the job, not a
// crash of the command that checks it (run --check, jobs).
func TestAValidateThatPanicsIsAParamsError(t *testing.T) {
	r := NewRegistry()
	MustRegisterTyped(r, "v", func(context.Context, Run, panicky) error { return nil })
	err := r.CheckParams("v", Params{})
	var pe *ParamError
	if !errors.As(err, &pe) || pe.Job != "v" || !strings.Contains(err.Error(), "params: Validate panicked: a bug in Validate") {
		t.Fatalf("CheckParams = %v, want a params error of job v saying Validate panicked", err)
	}
}

// A name the configuration could never use is refused at registration.
func TestRegisterRefusesNamesAConfigCannotUse(t *testing.T) {
	r := NewRegistry()
	for _, name := range []string{"reports hourly", "x\ty", "  ", "a\nb"} {
		if err := r.Register(name, ok); err == nil || !strings.Contains(err.Error(), "spaces or control characters") || r.Has(name) {
			t.Errorf("Register(%q) = %v, want refused", name, err)
		}
	}
	if err := r.Register("rapports.été@eu", ok); err != nil {
		t.Errorf("Register of a unicode name: %v", err)
	}
}

// Each run's params are its own deep copy: a handler's writes, nested
// ones too, reach no other run, and the job's params stay as configured.
func TestParamsCloneIsDeep(t *testing.T) {
	p := Params{"a": map[string]any{"b": []any{1, map[string]any{"c": "d"}}}, "e": "f"}
	c := p.Clone()
	c["e"] = "changed"
	c["a"].(map[string]any)["b"].([]any)[1].(map[string]any)["c"] = "changed"
	c["new"] = 1
	if p["e"] != "f" || p["a"].(map[string]any)["b"].([]any)[1].(map[string]any)["c"] != "d" || p["new"] != nil {
		t.Fatalf("writes to a clone reached the original: %v", p)
	}
	if Params(nil).Clone() != nil {
		t.Error("a nil Params cloned to non-nil")
	}
}
