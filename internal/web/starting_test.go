package web_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/web"
)

// While a replica waits for its backend, it is alive and not ready, and
// its API answers JSON like every other API answer: the same error
// shape, with why. It answered plain text (an outside review).
func TestTheStartingSurfaceAnswersTheAPIInJSON(t *testing.T) {
	h := web.Starting(nil)
	for _, tt := range []struct {
		method, path string
		code         int
		json         bool
	}{
		{http.MethodGet, "/healthz", http.StatusOK, false},
		{http.MethodGet, "/readyz", http.StatusServiceUnavailable, false},
		{http.MethodGet, "/api/jobs", http.StatusServiceUnavailable, true},
		{http.MethodPost, "/api/jobs/x/pause", http.StatusServiceUnavailable, true},
		{http.MethodGet, "/", http.StatusServiceUnavailable, false},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
		if rec.Code != tt.code {
			t.Errorf("%s %s: %d, want %d", tt.method, tt.path, rec.Code, tt.code)
		}
		if !tt.json {
			continue
		}
		var body struct{ Error string }
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") ||
			json.Unmarshal(rec.Body.Bytes(), &body) != nil || !strings.Contains(body.Error, "waiting for the claimer backend") {
			t.Errorf("%s %s: %s %q, want a JSON error saying it waits for its backend", tt.method, tt.path, ct, rec.Body.String())
		}
	}
}
