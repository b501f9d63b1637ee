package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
	"github.com/scheduler-dev/scheduler/internal/claim/postgres"
)

var base = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// A replica whose server is down must fail closed, with ErrUnavailable, and
// never show the DSN's password.
func TestUnreachableServerIsUnavailable(t *testing.T) {
	const secret = "s3cret-pw"
	c, err := postgres.Open(t.Context(), "postgres://postgres:"+secret+"@127.0.0.1:1/test?sslmode=disable&connect_timeout=5", postgres.Options{Instance: "replica-a"})
	if err != nil {
		t.Fatalf("open must not need the server: %v", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	_, claimErr := claim.ClaimOne(ctx, c, claim.Run{Job: "job.down", At: base}, time.Minute)
	pingErr := c.Ping(ctx)
	_, histErr := c.History(ctx, "", 10)
	for what, err := range map[string]error{"claim": claimErr, "ping": pingErr, "history": histErr} {
		if !errors.Is(err, claim.ErrUnavailable) {
			t.Errorf("%s: %v, want ErrUnavailable", what, err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s error shows the password: %v", what, err)
		}
	}
	cl := &claim.Claim{Run: claim.Run{Job: "job.down", At: base}, Token: claim.NewToken()}
	if err := c.Renew(ctx, cl, time.Minute); !errors.Is(err, claim.ErrUnavailable) {
		t.Errorf("renew: %v, want ErrUnavailable", err)
	}
	if err := claim.ReleaseOne(ctx, c, cl, claim.Succeeded); !errors.Is(err, claim.ErrUnavailable) {
		t.Errorf("release: %v, want ErrUnavailable", err)
	}
	if _, err := c.Controls().Put(ctx, claim.Control{Key: "pause/j", Version: 1}); !errors.Is(err, claim.ErrUnavailable) {
		t.Errorf("put control: %v, want ErrUnavailable", err)
	}
	if _, err := c.Controls().List(ctx, ""); !errors.Is(err, claim.ErrUnavailable) {
		t.Errorf("list controls: %v, want ErrUnavailable", err)
	}
}

func TestBadDSNHidesPassword(t *testing.T) {
	const secret = "s3cret-pw"
	_, err := postgres.Open(t.Context(), "postgres://postgres:"+secret+"@127.0.0.1:notaport/test", postgres.Options{})
	if err == nil {
		t.Fatal("open with a bad port succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error shows the password: %v", err)
	}
}

func TestNewPanicsOnNilPool(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New(nil) did not panic")
		}
	}()
	postgres.New(nil, postgres.Options{})
}
