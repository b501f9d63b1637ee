package main_test

import (
	"strings"
	"testing"
)

// TestRunCheckRejectsBadParams: the shipped handlers declare their params,
// so `run --check` exits 2 on a bad value, naming the file and the key,
// and passes the same config with valid values.
func TestRunCheckRejectsBadParams(t *testing.T) {
	const jobs = `claimer:
  kind: memory
http:
  addr: ""
jobs:
  example.sleep:
    schedule: "@every 5s"
    params: {duration: DURATION}
  billing.nightly:
    schedule: "30 2 * * *"
    params: {period: PERIOD}
`
	dir := t.TempDir()
	bad := writeConfig(t, dir, strings.NewReplacer("DURATION", "forever", "PERIOD", "yesterday").Replace(jobs))
	r := run(t, dir, "run", "--check", "--config", bad)
	for _, want := range []string{
		bad + `: jobs.example.sleep.params.duration: "forever": want a duration such as "1s"`,
		bad + `: jobs.billing.nightly.params.period: "yesterday": want a date`,
	} {
		if r.code != 2 || !strings.Contains(r.stderr, want) {
			t.Errorf("bad params: %+v; want exit 2 naming %s", r, want)
		}
	}
	good := writeConfig(t, dir, strings.NewReplacer("DURATION", "1s", "PERIOD", "2026-01-31").Replace(jobs))
	if r := run(t, dir, "run", "--check", "--config", good); r.code != 0 || !strings.Contains(r.stdout, "configuration ok") {
		t.Errorf("valid params: %+v", r)
	}
}
