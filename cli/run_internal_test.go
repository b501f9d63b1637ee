package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/config"
)

// A replica starting beside its backend waits for what will come (a
// server refusing, unresolved, loading its data set, answering too
// slowly: a Redlock majority of them) and ends at once on what will not
// (a wrong password, a bad certificate, a refused prefix).
func TestUnreachableIsWhatAskingAgainMends(t *testing.T) {
	for msg, want := range map[string]bool{
		"redis 127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused":                                                            true,
		"dial tcp: lookup redis-a.internal: no such host":                                                                                 true,
		"redlock: check: done on 1 of 3 nodes, 2 did not answer: unavailable (2× node 1: LOADING Redis is loading the dataset in memory)": true,
		"redlock: check: done on 0 of 3 nodes, 3 did not answer: unavailable (3× node 0: unavailable: context deadline exceeded)":         true,
		"redis 10.0.0.1:6379: read tcp 10.0.0.2:5000->10.0.0.1:6379: i/o timeout":                                                         true,
		"redlock: node 0: redis: WRONGPASS invalid username-password pair or user is disabled.":                                           false,
		"redis: maxmemory at 127.0.0.1:6379 is 10485760 bytes with maxmemory-policy \"allkeys-lru\"":                                      false,
		"tls: failed to verify certificate: x509: certificate signed by unknown authority":                                                false,
	} {
		if got := unreachable(errors.New(msg)); got != want {
			t.Errorf("unreachable(%q) = %v, want %v", msg, got, want)
		}
	}
}

// An opener's error may repeat the DSN it was handed: its password, in
// the DSN or given on its own, is masked before it is logged (an outside
// review found one logged whole).
func TestAnOpenersErrorHasItsDatabasesPasswordsMasked(t *testing.T) {
	for _, d := range []config.Database{
		{Kind: "postgres", DSN: "postgres://app:hunter2@127.0.0.1:1/x"},
		{Kind: "postgres", DSN: "postgres://app@127.0.0.1:1/x", Password: "hunter2"},
	} {
		err := redactDatabase(fmt.Errorf("job opener.err: open: connect %s (password %s): refused", d.DSN, "hunter2"), d)
		if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "refused") {
			t.Errorf("redactDatabase = %v, want the error without the password", err)
		}
	}
	if redactDatabase(nil, config.Database{}) != nil {
		t.Error("redactDatabase(nil) is not nil")
	}
}
