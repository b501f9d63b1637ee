package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"modernc.org/sqlite"
)

// fullError is a real SQLITE_FULL, from a scratch file capped at two
// pages.
func fullError(t *testing.T) error {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "tiny.db")+"?_pragma=max_page_count(2)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE t (b BLOB); INSERT INTO t VALUES (zeroblob(100000))`)
	var se *sqlite.Error
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "full") {
		t.Fatalf("filling a capped file: %v, want SQLITE_FULL", err)
	}
	return err
}

// While the file refuses every write (a full disk), a statement that
// writes nothing (a takeover bid held back: sql.ErrNoRows) is no answer:
// the hold lasts until a write lands, however long the refusal, and ends
// a lease after one does. Counted as answers, the held bids ended the
// hold by its chronic cap after three leases of a full disk, and a
// standby ran a finished run again the moment space came back (an
// outside review). Without a refusal, such statements still count (a
// standby whose only writes are held bids, after a stall, takes over
// once the hold has run its lease).
func TestHeldBidsOnAFullDiskDoNotEndTheHold(t *testing.T) {
	// A second: the one check that must come within a lease of a write
	// (the hold still on) has a second to spare on a busy machine.
	const lease = time.Second
	full := fullError(t)
	c, err := Open(t.Context(), filepath.Join(t.TempDir(), "claims.db"), Options{Instance: "standby"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	write := func(err error) { _ = c.write(ctx, func() error { return err }) }

	// Past the chronic cap's three leases of answers.
	for end := time.Now().Add(5 * lease); time.Now().Before(end); time.Sleep(lease / 10) {
		write(full)
		write(sql.ErrNoRows)
		write(sql.ErrNoRows)
		if !c.TakeoversHeld(lease) {
			t.Fatal("the hold ended while every write was refused")
		}
	}
	write(nil) // space is back: a write lands
	if !c.TakeoversHeld(lease) {
		t.Fatal("the hold ended as the first write landed, not a lease later")
	}
	time.Sleep(lease + lease/2)
	write(nil)
	if c.TakeoversHeld(lease) {
		t.Fatal("the hold outlasted a lease of landed writes")
	}

	// A write its caller cancelled (a renewal stopped by its run's
	// release) says nothing of the file: no hold.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_ = c.write(cctx, func() error { return cctx.Err() })
	if c.TakeoversHeld(lease) {
		t.Fatal("a write its caller cancelled held takeovers back")
	}
	// No refusal: a write whose time ran out (unanswered), then only
	// held bids, which count. The hold ends a lease later.
	dctx, stop := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer stop()
	_ = c.write(dctx, func() error { return dctx.Err() })
	if !c.TakeoversHeld(lease) {
		t.Fatal("no hold after an unanswered write")
	}
	write(sql.ErrNoRows)
	time.Sleep(lease + lease/2)
	write(sql.ErrNoRows)
	if c.TakeoversHeld(lease) {
		t.Fatal("held bids alone, with no refusal, never ended the hold")
	}
}
