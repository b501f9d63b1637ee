package sqlite

import (
	"context"
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// translate maps a SQLite error onto the claim vocabulary. Context errors
// pass through unchanged (never a sentinel); a file that is locked past the
// busy timeout, unreadable, unwritable or full wraps claim.ErrUnavailable;
// anything else is returned wrapped.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff { // primary result code
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR,
			sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY,
			sqlite3.SQLITE_PROTOCOL:
			return fmt.Errorf("%w: %w", claim.ErrUnavailable, err)
		}
	}
	return fmt.Errorf("sqlite: %w", err)
}
