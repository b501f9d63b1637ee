package config

import (
	"strings"
	"testing"
	"time"
)

func TestClaimWindow(t *testing.T) {
	tests := []struct {
		name               string
		grace, lease, skew time.Duration
		want               time.Duration
	}{
		{"Defaults", time.Hour, 30 * time.Second, 2 * time.Second, time.Hour + 4*time.Second + time.Minute},
		{"GraceBelowLateTolerance", time.Second, 10 * time.Second, 2 * time.Second, 9*time.Second + 4*time.Second + 20*time.Second},
		{"ZeroGraceIsTheRunnersHour", 0, 30 * time.Second, 2 * time.Second, time.Hour + 4*time.Second + time.Minute},
		{"ZeroSkewIsTheRunnersTwoSeconds", time.Hour, 30 * time.Second, 0, time.Hour + 4*time.Second + time.Minute},
		{"SkewWidensTheLateTolerance", time.Minute, time.Second, 30 * time.Second, 65*time.Second + time.Minute + 2*time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClaimWindow(tt.grace, tt.lease, tt.skew); got != tt.want {
				t.Errorf("ClaimWindow(%v, %v, %v) = %v, want %v", tt.grace, tt.lease, tt.skew, got, tt.want)
			}
		})
	}
}

func TestMinRetentionNamesTheJobThatNeedsMost(t *testing.T) {
	c := mustLoad(t, `
jobs:
  a: {schedule: "@hourly", misfire: {grace: 2h}}
  b: {schedule: "@hourly", enabled: false, misfire: {grace: 72h}}
  c: {schedule: "@hourly", misfire: {grace: 1m}}
`)
	if d, job := c.MinRetention(); d != 72*time.Hour+time.Minute+4*time.Second || job != "b" {
		t.Errorf("MinRetention = %v, %q; want 72h1m4s, b (disabled jobs count: enabling one looks back over its grace)", d, job)
	}
	if d, job := mustLoad(t, "claimer:\n  lease: 10s\n").MinRetention(); d != time.Hour+24*time.Second || job != "" {
		t.Errorf("MinRetention without jobs = %v, %q; want a default job's 1h0m24s", d, job)
	}
}

// A done_ttl of exactly MinRetention is allowed; one millisecond less is
// refused, naming the key, the value and the job.
func TestDoneTTLAtMinRetention(t *testing.T) {
	conf := func(ttl string) string {
		return "claimer:\n  kind: redis\n  redis:\n    addr: h:1\n    done_ttl: " + ttl + "\n" +
			"jobs:\n  billing.nightly:\n    schedule: '@daily'\n    misfire: {policy: run-once, grace: 72h}\n"
	}
	mustLoad(t, conf("72h1m4s"))
	_, path, err := load(t, conf("72h1m3.999s"))
	if err == nil {
		t.Fatal("done_ttl one millisecond below MinRetention loaded")
	}
	want := path + `: claimer.redis.done_ttl: "72h1m3.999s": must be at least 72h1m4s, the longest a replica may still claim a finished run of jobs.billing.nightly: max(misfire.grace 72h0m0s, late tolerance 9s) + 2×max_clock_skew 2s + 2×lease 30s`
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got  %v\nwant %s…", err, want)
	}
}
