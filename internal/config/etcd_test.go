package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEtcdBlock(t *testing.T) {
	et := "claimer:\n  kind: etcd\n  etcd:\n"
	for _, tt := range []struct{ name, yaml, key, value, msg string }{
		{"WithoutEndpoints", et + "    password: " + secret + "\n    username: u\n", "claimer.etcd.endpoints", "", "missing"},
		{"EndpointIsURL", et + "    endpoints: ['https://u:" + secret + "@h:2379']\n", "claimer.etcd.endpoints[0]", "https://u:xxxxx@h:2379", "not a URL (TLS is claimer.etcd.tls)"},
		{"DuplicateEndpoint", et + "    endpoints: [a:1, b:1, A:1]\n", "claimer.etcd.endpoints[2]", "A:1", "duplicate of endpoints[0]"},
		{"PasswordWithoutUser", et + "    endpoints: [a:1]\n    password: " + secret + "\n", "claimer.etcd.username", "", "needs a user name"},
		{"PasswordAndPasswordFile", et + "    endpoints: [a:1]\n    username: u\n    password: " + secret + "\n    password_file: /run/secrets/etcd\n", "claimer.etcd.password_file", "", "keep one"},
		{"DoneTTLShort", et + "    endpoints: [a:1]\n    done_ttl: 1h\njobs:\n  billing.nightly:\n    schedule: '@daily'\n", "claimer.etcd.done_ttl", "1h0m0s", "at least 1h1m4s"},
		{"ZeroDialTimeout", et + "    endpoints: [a:1]\n    dial_timeout: 0s\n", "claimer.etcd.dial_timeout", "0s", "must be positive"},
		{"TLSKeyWithoutCert", et + "    endpoints: [a:1]\n    tls: {enabled: true, key_file: /k.pem}\n", "claimer.etcd.tls.cert_file", "", "needs cert_file"},
		{"TLSSettingsWhileDisabled", et + "    endpoints: [a:1]\n    tls: {enabled: false, ca_file: /ca.pem}\n", "claimer.etcd.tls.enabled", "false", "claimer.etcd.tls.ca_file is set: connections would go without TLS"},
	} {
		t.Run(tt.name, func(t *testing.T) { wantProblem(t, tt.yaml, tt.key, tt.value, tt.msg) })
	}

	t.Run("DefaultsPasswordFileAndRedaction", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "pw")
		if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c := mustLoad(t, et+"    endpoints: [e1:2379, e2:2379, e3:2379]\n    username: scheduler\n    password_file: "+file+"\n")
		e := c.Claimer.Etcd
		if string(e.Password) != secret || e.Prefix != "scheduler/" || e.DoneTTL.Duration() != 48*time.Hour ||
			e.DialTimeout.Duration() != 5*time.Second || len(e.Endpoints) != 3 {
			t.Errorf("etcd block = %+v", e)
		}
		for name, s := range map[string]string{"Redacted": c.Redacted(), "%+v": fmt.Sprintf("%+v", e), "%#v": fmt.Sprintf("%#v", e)} {
			if strings.Contains(s, secret) {
				t.Errorf("%s leaks the password:\n%s", name, s)
			}
		}
	})

	t.Run("OtherKindIgnoresTheBlock", func(t *testing.T) {
		c := mustLoad(t, "claimer:\n  kind: sqlite\n  etcd:\n    password_file: /nonexistent\n")
		if c.Claimer.Etcd.Password != "" {
			t.Error("read the password file of an unselected claimer")
		}
	})
}

// wantProblem loads yaml and checks that it fails with a problem for key
// that names the file, the key and value (when not empty) and says msg,
// and that no error shows the secret.
func wantProblem(t *testing.T, yaml, key, value, msg string) {
	t.Helper()
	_, path, err := load(t, yaml)
	if err == nil {
		t.Fatal("Load succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks the secret:\n%v", err)
	}
	want := path + ": " + key + ": "
	if value != "" {
		want += fmt.Sprintf("%q: ", value)
	}
	for _, p := range splitErrors(t, err) {
		if p.Key == key {
			if line := p.Error(); !strings.HasPrefix(line, want) || !strings.Contains(line, msg) {
				t.Errorf("got  %s\nwant %s…%s", line, want, msg)
			}
			return
		}
	}
	t.Fatalf("no problem for key %q in:\n%v", key, err)
}
