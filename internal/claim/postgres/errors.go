package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// translate maps a pgx error onto the claim vocabulary. Context errors pass
// through unchanged (never a sentinel); failures to reach a usable server
// wrap claim.ErrUnavailable; anything else is returned wrapped. pgx never
// puts the DSN's password in its errors.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case unavailable(err):
		return fmt.Errorf("%w: %w", claim.ErrUnavailable, err)
	}
	return fmt.Errorf("postgres: %w", err)
}

func unavailable(err error) bool {
	var (
		connectErr *pgconn.ConnectError
		pgErr      *pgconn.PgError
		netErr     net.Error
	)
	switch {
	case errors.As(err, &connectErr):
		// Refused, unresolvable, TLS or authentication failures: no usable
		// server either way.
		return true
	case errors.As(err, &pgErr):
		switch c := pgErr.Code; {
		case strings.HasPrefix(c, "08"), // connection exception
			strings.HasPrefix(c, "53"), // insufficient resources: too many connections, disk full
			c == "57P01",               // admin shutdown
			c == "57P02",               // crash shutdown
			c == "57P03",               // cannot connect now (starting up, recovery)
			c == "25006":               // read-only transaction: a standby after failover
			return true
		}
		return false
	}
	return errors.As(err, &netErr) || pgconn.Timeout(err) ||
		errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
