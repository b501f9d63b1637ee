package main_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// Secured backends, driven through the real binary: `scheduler run` must
// execute a run with the right credentials and TLS settings, and with
// wrong ones exit 1 at start-up with an error that names the backend and
// never prints a password.

// secureConfig is a replica config on claimer block, running example.sleep
// every second.
func secureConfig(claimerBlock string) string {
	return `instance_id: secure
claimer:
` + claimerBlock + `  lease: 3s
http:
  addr: ""
log:
  format: json
  level: debug
shutdown_grace: 1s
jobs:
  example.sleep:
    schedule: "* * * * * *"
`
}

// runsOK starts `scheduler run` on config, waits for a run to succeed, then
// stops it with SIGTERM and expects exit 0.
func runsOK(t *testing.T, dir, config string) {
	t.Helper()
	p := startReplica(t, dir, config, "replica")
	waitFor(t, "a run to succeed", func() bool {
		select {
		case <-p.done:
			t.Fatalf("scheduler exited early (%v): %s", p.cmd.ProcessState, readLog(t, dir, "replica"))
		default:
		}
		for _, e := range readEvents(t, dir, "replica") {
			if e.Msg == "run finished" && e.Status == "succeeded" {
				return true
			}
		}
		return false
	})
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("scheduler did not exit after SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit %d after SIGTERM: %s", code, readLog(t, dir, "replica"))
	}
}

// failsAtStartup runs `scheduler run` on config and expects exit 1 with an
// error containing every want and none of secrets.
func failsAtStartup(t *testing.T, dir, config string, secrets []string, want ...string) {
	t.Helper()
	r := run(t, dir, "run", "--config", config)
	out := r.stdout + r.stderr
	t.Logf("scheduler run: exit %d: %s", r.code, strings.TrimSpace(out))
	if r.code != 1 {
		t.Fatalf("exit %d, want 1: %s", r.code, out)
	}
	// The config asks for JSON logs: every line is one, go-redis's own
	// messages included.
	for line := range strings.Lines(strings.TrimSpace(r.stderr)) {
		if !json.Valid([]byte(line)) {
			t.Fatalf("stderr line is not JSON: %q", line)
		}
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(out, s) {
			t.Fatalf("output shows the secret %q: %s", s, out)
		}
	}
	for _, w := range want {
		if !strings.Contains(strings.ToLower(out), strings.ToLower(w)) {
			t.Fatalf("error does not say %q: %s", w, out)
		}
	}
}

func redisBlock(addr, extra string) string {
	return "  kind: redis\n  redis:\n    addr: " + addr + "\n    prefix: \"secure:" + randHex() + ":\"\n" + extra
}

func TestRedisPasswordAuth(t *testing.T) {
	const pw = "correct-horse-battery"
	srv := testenv.StartRedis(t, "--requirepass", pw)
	t.Run("RightPasswordRuns", func(t *testing.T) {
		dir := t.TempDir()
		runsOK(t, dir, writeConfig(t, dir, secureConfig(redisBlock(srv.Addr(), "    password: \""+pw+"\"\n"))))
	})
	t.Run("PasswordFileRuns", func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, "redis-password")
		if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		runsOK(t, dir, writeConfig(t, dir, secureConfig(redisBlock(srv.Addr(), "    password_file: "+file+"\n"))))
	})
	t.Run("WrongPasswordExitsOneWithoutIt", func(t *testing.T) {
		dir := t.TempDir()
		const wrong = "not-the-password-42"
		cfg := writeConfig(t, dir, secureConfig(redisBlock(srv.Addr(), "    password: \""+wrong+"\"\n")))
		failsAtStartup(t, dir, cfg, []string{wrong, pw}, "redis", srv.Addr(), "WRONGPASS")
	})
	t.Run("NoPasswordExitsOne", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeConfig(t, dir, secureConfig(redisBlock(srv.Addr(), "")))
		failsAtStartup(t, dir, cfg, []string{pw}, "redis", "NOAUTH")
	})
}

// TestARotatedPasswordFileIsReadAgain: a password_file is read anew at
// every new connection, so a secret rotated in place (a Kubernetes
// secret, rewritten by the kubelet, the server's password changed with
// it) is used from the next connection on. Read once at start-up, every
// connection after the rotation failed AUTH for good, and the replica ran
// nothing while /healthz stayed up (an outside review, on PostgreSQL;
// PostgreSQL's pool takes the same path, config.Rotating).
func TestARotatedPasswordFileIsReadAgain(t *testing.T) {
	const before, after = "first-secret-1", "second-secret-2"
	srv := testenv.StartRedis(t, "--requirepass", before)
	dir := t.TempDir()
	file := filepath.Join(dir, "redis-password")
	if err := os.WriteFile(file, []byte(before+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startReplica(t, dir, writeConfig(t, dir, secureConfig(redisBlock(srv.Addr(), "    password_file: "+file+"\n"))), "replica")
	succeededSince := func(since time.Time) bool {
		for _, e := range readEvents(t, dir, "replica") {
			if e.Msg == "run finished" && e.Status == "succeeded" && e.Time.After(since) {
				return true
			}
		}
		return false
	}
	waitFor(t, "a run to succeed", func() bool { return succeededSince(time.Time{}) })

	// Rotate: the server's password, then the file, then every
	// connection the replica holds is closed, as a server restart or an
	// idle timeout would.
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Password: before})
	defer admin.Close()
	ctx := t.Context()
	if err := admin.ConfigSet(ctx, "requirepass", after).Err(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file+".new", []byte(after+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".new", file); err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a run to succeed on the rotated password", func() bool {
		select {
		case <-p.done:
			t.Fatalf("scheduler exited (%v): %s", p.cmd.ProcessState, readLog(t, dir, "replica"))
		default:
		}
		return succeededSince(rotated.Add(time.Second))
	})
	if log := readLog(t, dir, "replica"); strings.Contains(log, before) || strings.Contains(log, after) {
		t.Fatal("the log shows a password")
	}
}

func TestRedisACLUser(t *testing.T) {
	const pw = "alice-s3cret"
	srv := testenv.StartRedis(t, "--user", "alice", "on", ">"+pw, "~*", "+@all")
	t.Run("UserAndPasswordRun", func(t *testing.T) {
		dir := t.TempDir()
		runsOK(t, dir, writeConfig(t, dir, secureConfig(redisBlock(srv.Addr(),
			"    username: alice\n    password: \""+pw+"\"\n"))))
	})
	t.Run("WrongUserExitsOne", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeConfig(t, dir, secureConfig(redisBlock(srv.Addr(), "    username: mallory\n    password: \""+pw+"\"\n")))
		failsAtStartup(t, dir, cfg, []string{pw}, "redis", "WRONGPASS")
	})
}

// pki is a CA and a server certificate it signed for 127.0.0.1 and
// localhost, as PEM files.
type pki struct{ ca, cert, key string }

func newPKI(t *testing.T, dir, name string) pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := pki{ca: filepath.Join(dir, name+"-ca.pem"), cert: filepath.Join(dir, name+"-cert.pem"), key: filepath.Join(dir, name+"-key.pem")}
	for path, block := range map[string]*pem.Block{
		p.ca: {Type: "CERTIFICATE", Bytes: caDER}, p.cert: {Type: "CERTIFICATE", Bytes: der},
		p.key: {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestRedisTLS runs a redis-server that serves TLS on its own port (its
// plain port stays open only for testenv's readiness check) with a
// certificate from a CA made here.
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	server := newPKI(t, dir, "server")
	other := newPKI(t, dir, "other")
	port := freePort(t)
	testenv.StartRedis(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", server.cert,
		"--tls-key-file", server.key, "--tls-ca-cert-file", server.ca, "--tls-auth-clients", "no")
	addr := "127.0.0.1:" + strconv.Itoa(port)
	tlsBlock := func(ca string) string { return "    tls:\n      enabled: true\n      ca_file: " + ca + "\n" }
	t.Run("RightCARuns", func(t *testing.T) {
		dir := t.TempDir()
		runsOK(t, dir, writeConfig(t, dir, secureConfig(redisBlock(addr, tlsBlock(server.ca)))))
	})
	t.Run("WrongCAExitsOne", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeConfig(t, dir, secureConfig(redisBlock(addr, tlsBlock(other.ca))))
		failsAtStartup(t, dir, cfg, nil, "redis", addr, "certificate signed by unknown authority")
	})
	t.Run("PlainClientOnTLSPortExitsOne", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeConfig(t, dir, secureConfig(redisBlock(addr, "")))
		failsAtStartup(t, dir, cfg, nil, "redis", addr)
	})
}

// TestPostgresTLS checks sslmode against the local server's own TLS (the
// Debian cluster serves its snakeoil certificate when ssl is on). Starting
// a second server with a certificate of our own would be heavy, and a TLS
// terminator in front of 5432 would not do: PostgreSQL negotiates TLS after
// an SSLRequest preamble (direct TLS needs PostgreSQL 17).
func TestPostgresTLS(t *testing.T) {
	dsn := testenv.PostgresSchema(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var ssl, certFile string
	err = conn.QueryRow(ctx, "SELECT current_setting('ssl'), current_setting('ssl_cert_file')").Scan(&ssl, &certFile)
	_ = conn.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ssl != "on" {
		testenv.Missing(t, "postgres TLS", "the local PostgreSQL runs with ssl off; sslmode cases need a server with TLS")
	}
	withSSL := func(t *testing.T, params url.Values) string {
		t.Helper()
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		for k, v := range params {
			q[k] = v
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	pgBlock := func(dsn string) string { return "  kind: postgres\n  postgres:\n    dsn: \"" + dsn + "\"\n" }
	t.Run("RequireRuns", func(t *testing.T) {
		dir := t.TempDir()
		runsOK(t, dir, writeConfig(t, dir, secureConfig(pgBlock(withSSL(t, url.Values{"sslmode": {"require"}})))))
	})
	t.Run("VerifyCAWithTheServersCertificateRuns", func(t *testing.T) {
		if _, err := os.ReadFile(certFile); err != nil {
			testenv.Missing(t, "postgres TLS", fmt.Sprintf("server certificate %s not readable here: %v", certFile, err))
		}
		dir := t.TempDir()
		runsOK(t, dir, writeConfig(t, dir, secureConfig(pgBlock(withSSL(t,
			url.Values{"sslmode": {"verify-ca"}, "sslrootcert": {certFile}})))))
	})
	// The rest fail in TLS, before authentication: the DSN's password is
	// never sent, and must never be printed either.
	const pw = "pg-pa55-word"
	withPassword := func(dsn string) string {
		u, _ := url.Parse(dsn)
		u.User = url.UserPassword(u.User.Username(), pw)
		return u.String()
	}
	t.Run("VerifyCAWithAnotherCAExitsOne", func(t *testing.T) {
		dir := t.TempDir()
		other := newPKI(t, dir, "other")
		cfg := writeConfig(t, dir, secureConfig(pgBlock(withPassword(withSSL(t,
			url.Values{"sslmode": {"verify-ca"}, "sslrootcert": {other.ca}})))))
		failsAtStartup(t, dir, cfg, []string{pw}, "postgres", "certificate signed by unknown authority")
	})
	t.Run("VerifyFullOnAMismatchedHostExitsOne", func(t *testing.T) {
		if _, err := os.ReadFile(certFile); err != nil {
			testenv.Missing(t, "postgres TLS", fmt.Sprintf("server certificate %s not readable here: %v", certFile, err))
		}
		dir := t.TempDir()
		cfg := writeConfig(t, dir, secureConfig(pgBlock(withPassword(withSSL(t,
			url.Values{"sslmode": {"verify-full"}, "sslrootcert": {certFile}})))))
		failsAtStartup(t, dir, cfg, []string{pw}, "postgres", "cannot validate certificate for 127.0.0.1")
	})
	t.Run("UnreadableRootCertExitsOne", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeConfig(t, dir, secureConfig(pgBlock(withPassword(withSSL(t,
			url.Values{"sslmode": {"verify-full"}, "sslrootcert": {filepath.Join(dir, "missing.pem")}})))))
		r := run(t, dir, "run", "--config", cfg)
		if r.code == 0 || strings.Contains(r.stdout+r.stderr, pw) {
			t.Fatalf("exit %d, want an error without the password: %s", r.code, r.stdout+r.stderr)
		}
	})
}
