package job

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func ok(context.Context, Run) error { return nil }

func TestRegisterRejectsBadAndDuplicateNames(t *testing.T) {
	r := NewRegistry()
	open := func(context.Context, Resources) (Handler, func() error, error) { return ok, nil, nil }
	if err := r.Register("", ok); err == nil {
		t.Error("empty name accepted")
	}
	if err := r.Register("a", nil); err == nil {
		t.Error("nil handler accepted")
	}
	if err := r.RegisterOpener("b", nil); err == nil {
		t.Error("nil opener accepted")
	}
	r.MustRegister("a", ok)
	r.MustRegisterOpener("b", open)
	if err := r.RegisterOpener("a", open); err == nil {
		t.Error("opener registered over a handler")
	}
	if err := r.Register("b", ok); err == nil {
		t.Error("handler registered over an opener")
	}
	if got := r.Names(); !slices.Equal(got, []string{"a", "b"}) || !r.Has("b") || r.Has("c") {
		t.Errorf("Names() = %v", got)
	}
}

// TestOpenBindsOpenersUntilClose: a job registered with an opener is known
// at once, fails until opened, runs what its opener returned while open, and
// fails again after close, which releases in reverse order.
func TestOpenBindsOpenersUntilClose(t *testing.T) {
	r := NewRegistry()
	var events []string
	opener := func(name string) Opener {
		return func(_ context.Context, res Resources) (Handler, func() error, error) {
			events = append(events, "open "+name+" "+res.Database.Path)
			return func(context.Context, Run) error { events = append(events, "run "+name); return nil },
				func() error { events = append(events, "close "+name); return errors.New(name) }, nil
		}
	}
	r.MustRegisterOpener("x", opener("x"))
	r.MustRegisterOpener("y", opener("y"))
	r.MustRegisterOpener("unused", opener("unused"))
	r.MustRegister("plain", ok)
	hx, _ := r.Lookup("x")
	if err := hx(t.Context(), Run{}); err == nil || !strings.Contains(err.Error(), "not opened") {
		t.Fatalf("before Open: %v", err)
	}
	closeAll, err := r.Open(t.Context(), Resources{Database: Database{Kind: "sqlite", Path: "f.db"}}, "x", "plain", "missing", "y", "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := hx(t.Context(), Run{}); err != nil {
		t.Fatalf("open: %v", err)
	}
	if _, err := r.Open(t.Context(), Resources{}, "y"); err == nil || !strings.Contains(err.Error(), "job y: already open") {
		t.Fatalf("second Open: %v", err)
	}
	if err := closeAll(); err == nil || err.Error() != "y\nx" {
		t.Fatalf("close: %v", err)
	}
	if err := hx(t.Context(), Run{}); err == nil {
		t.Fatal("runs after close")
	}
	want := []string{"open x f.db", "open y f.db", "run x", "close y", "close x"}
	if !slices.Equal(events, want) {
		t.Fatalf("events %q, want %q", events, want)
	}
	if _, err := r.Open(t.Context(), Resources{}, "x"); err != nil { // closed: may open again
		t.Fatal(err)
	}
}

// TestOpenFailureLeavesNothingOpen: when an opener fails, the jobs opened
// before it are closed and unbound, and all of them can be opened again.
func TestOpenFailureLeavesNothingOpen(t *testing.T) {
	r := NewRegistry()
	closed := 0
	r.MustRegisterOpener("good", func(context.Context, Resources) (Handler, func() error, error) {
		return ok, func() error { closed++; return nil }, nil
	})
	fail := true
	r.MustRegisterOpener("bad", func(context.Context, Resources) (Handler, func() error, error) {
		if fail {
			return nil, nil, fmt.Errorf("no database")
		}
		return ok, nil, nil
	})
	if _, err := r.Open(t.Context(), Resources{}, "good", "bad"); err == nil || err.Error() != "job bad: open: no database" {
		t.Fatalf("Open: %v", err)
	}
	if closed != 1 {
		t.Fatalf("good closed %d times, want 1", closed)
	}
	if h, _ := r.Lookup("good"); h(t.Context(), Run{}) == nil {
		t.Fatal("good still bound")
	}
	fail = false
	closeAll, err := r.Open(t.Context(), Resources{}, "good", "bad")
	if err != nil {
		t.Fatal(err)
	}
	_ = closeAll()
}

func TestDatabaseStringHidesThePassword(t *testing.T) {
	d := Database{Kind: "postgres", DSN: "postgres://u:hunter2@h/db", Password: "hunter3"}
	for _, s := range []string{d.String(), fmt.Sprintf("%v %+v %#v", d, d, d), fmt.Sprint(Resources{Database: d})} {
		if strings.Contains(s, "hunter") {
			t.Errorf("%q shows a password", s)
		}
	}
	if s := (Database{Kind: "sqlite", Path: "./scheduler.db"}).String(); s != "sqlite ./scheduler.db" {
		t.Errorf("sqlite: %q", s)
	}
}
