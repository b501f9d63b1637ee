package cli

import (
	"errors"
	"testing"
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
