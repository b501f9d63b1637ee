package web_test

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scheduler-dev/scheduler/internal/testenv"
)

// harness is a test-only page, served beside the status page on the same
// origin, that acts as an operator would: it loads / in an iframe, types
// the token, a name and a note into the page's inputs, clicks the button
// labelled by its query, waits for #action-result to show the API's
// answer, and writes what it saw into #out. Chromium's --dump-dom prints
// it once the virtual time budget is spent.
const harness = `<!doctype html>
<html><head><meta charset="utf-8"><title>harness</title></head><body>
<pre id="out">waiting</pre>
<iframe id="f" src="/" width="1200" height="700"></iframe>
<script>
var q = new URLSearchParams(location.search);
var f = document.getElementById("f"), out = document.getElementById("out"), started = false;
f.addEventListener("load", function () {
  if (started) return; // the page reloads itself every 5s
  started = true;
  var d = f.contentDocument;
  function type(id, v) {
    var el = d.getElementById(id);
    if (!el) throw new Error("no input #" + id);
    el.value = v;
    el.dispatchEvent(new Event("input", {bubbles: true}));
  }
  try {
    type("token", q.get("token"));
    type("actor", q.get("by"));
    type("note", q.get("note"));
  } catch (e) { out.textContent = "ERROR: " + e.message; return; }
  var btn = d.querySelector('button[aria-label="' + q.get("label") + '"]');
  if (!btn) { out.textContent = "ERROR: no button " + q.get("label"); return; }
  var result = d.getElementById("action-result"), before = result.textContent;
  btn.click();
  var deadline = Date.now() + 8000;
  (function poll() {
    var doc = f.contentDocument, el = doc && doc.getElementById("action-result");
    var now = el ? el.textContent : "";
    if (now && now !== before && now.indexOf("sending") < 0) { out.textContent = "RESULT: " + now; return; }
    if (Date.now() > deadline) { out.textContent = "TIMEOUT: " + now; return; }
    setTimeout(poll, 50);
  })();
});
</script></body></html>`

// TestStatusPageButtonsInABrowser clicks the page's buttons in headless
// Chromium: a wrong token is refused and shown, the right one pauses the
// job in the control store, "run now" requests a run, and the page then
// renders the job as paused with its note.
func TestStatusPageButtonsInABrowser(t *testing.T) {
	browser := testenv.Chromium(t)
	e := newAPIEnv(t, secretToken, func(h http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("/", h)
		mux.HandleFunc("GET /_harness.html", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte(harness))
		})
		return mux
	})
	click := func(token, label string) string {
		t.Helper()
		q := url.Values{"token": {token}, "label": {label}, "by": {"ops-alice"}, "note": {"maintenance window"}}
		dom := testenv.Headless(t, browser, "--virtual-time-budget=10000", "--dump-dom", e.srv.URL+"/_harness.html?"+q.Encode())
		_, rest, ok := strings.Cut(dom, `<pre id="out">`)
		got, _, _ := strings.Cut(rest, "</pre>")
		if !ok {
			t.Fatalf("no #out in the harness:\n%s", dom)
		}
		return got
	}

	got := click("not-the-token", "pause billing.nightly")
	if want := "RESULT: pause billing.nightly failed: HTTP 401: missing or wrong bearer token"; got != want {
		t.Fatalf("with a wrong token the harness saw %q, want %q", got, want)
	}
	if ps, _ := e.controls.Pauses(t.Context()); len(ps) != 0 {
		t.Fatalf("a wrong token paused: %+v", ps)
	}

	got = click(secretToken, "pause billing.nightly")
	if want := "RESULT: pause billing.nightly: ok, paused by ops-alice"; got != want {
		t.Fatalf("the harness saw %q, want %q", got, want)
	}
	ps, err := e.controls.Pauses(t.Context())
	p := ps["billing.nightly"]
	if err != nil || !p.Paused || p.By != "ops-alice" || p.Note != "maintenance window" || !strings.HasPrefix(p.RequestID, "page-") || ps.Paused("minutely") {
		t.Fatalf("the store after the click: %+v %v", ps, err)
	}

	got = click(secretToken, "run minutely now")
	reqs, err := e.controls.Requests(t.Context())
	if err != nil || len(reqs) != 1 || reqs[0].Job != "minutely" || reqs[0].By != "ops-alice" ||
		got != "RESULT: trigger minutely: ok, requested run "+reqs[0].Run().ID() {
		t.Fatalf("run now: the harness saw %q; requests %+v %v", got, reqs, err)
	}

	dom := testenv.Headless(t, browser, "--dump-dom", e.srv.URL+"/")
	rowOf := func(job string) string {
		t.Helper()
		_, row, ok := strings.Cut(dom, `<tr class="job"><td>`+job+`</td>`)
		if !ok {
			t.Fatalf("the rendered page has no row for %s:\n%s", job, dom)
		}
		row, _, _ = strings.Cut(row, "</tr>")
		return row
	}
	row := rowOf("billing.nightly")
	for _, want := range []string{`<span class="paused">paused</span> by ops-alice at `, "— maintenance window",
		`aria-label="resume billing.nightly"`} {
		if !strings.Contains(row, want) {
			t.Fatalf("the rendered row of billing.nightly lacks %q:\n%s\n\npage:\n%s", want, row, dom)
		}
	}
	if other := rowOf("minutely"); strings.Contains(other, "paused</span>") {
		t.Fatalf("minutely shows as paused:\n%s", other)
	}
	if strings.Contains(dom, secretToken) {
		t.Fatal("the token is rendered in the page")
	}
	shot := filepath.Join(testenv.ArtifactDir(t), "status-page-controls.png")
	testenv.Headless(t, browser, "--window-size=1280,800", "--screenshot="+shot, e.srv.URL+"/")
	if st, err := os.Stat(shot); err != nil || st.Size() < 1000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
}
