package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// The operator's state (claim.Controls: pauses, run requests) lives in the
// scheduler_controls table of the claimer's own file, beside the runs, so
// every process that shares the runs sees the same pauses and requests
// without another store to configure.
const (
	// controlWins is whether the new entry (excluded) replaces the stored
	// one in an upsert: the stored one expired, on SQLite's clock, or
	// claim.Control.Wins (never with first, else a higher version).
	controlWins = `(
       (scheduler_controls.expires_at IS NOT NULL AND scheduler_controls.expires_at <= ` + nowMS + `)
    OR (NOT excluded.first AND excluded.version > scheduler_controls.version))`

	// putControl stores an entry unless the key holds one that wins over
	// it, and returns what the key holds afterwards, in one statement: the
	// update of a losing entry writes the stored values back, so RETURNING
	// always has the row and no second read can see a later write.
	putControl = `
INSERT INTO scheduler_controls (key, value, version, first, expires_at)
VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (key) DO UPDATE
   SET value      = CASE WHEN ` + controlWins + ` THEN excluded.value ELSE scheduler_controls.value END,
       version    = CASE WHEN ` + controlWins + ` THEN excluded.version ELSE scheduler_controls.version END,
       first      = CASE WHEN ` + controlWins + ` THEN excluded.first ELSE scheduler_controls.first END,
       expires_at = CASE WHEN ` + controlWins + ` THEN excluded.expires_at ELSE scheduler_controls.expires_at END
RETURNING value, version, first, expires_at`

	// listControls compares the prefix as bytes (BLOB), as Go does; the
	// range on key lets the primary key find the first match.
	listControls = `
SELECT key, value, version, first, expires_at FROM scheduler_controls
 WHERE key >= ?1 AND substr(CAST(key AS BLOB), 1, length(CAST(?1 AS BLOB))) = CAST(?1 AS BLOB)
   AND (expires_at IS NULL OR expires_at > ` + nowMS + `)
 ORDER BY key`

	pruneControls = `DELETE FROM scheduler_controls WHERE expires_at <= ` + nowMS
)

// Controls returns the register of operator state in c's file. It shares
// c's statements and write queue, so it is usable until c is closed.
func (c *Claimer) Controls() claim.Controls { return controls{c} }

type controls struct{ c *Claimer }

var _ claim.Controls = controls{}

// expiresMS is t in unix milliseconds rounded up, so an entry never expires
// before it asked to, or nil (never) for the zero time.
func expiresMS(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	ms := t.UnixMilli()
	if time.UnixMilli(ms).Before(t) {
		ms++
	}
	return ms
}

// Put implements claim.Controls in one write statement.
func (s controls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	if err := claim.CheckControl(ctx, e); err != nil {
		return claim.Control{}, err
	}
	value := e.Value
	if value == nil {
		value = []byte{} // the column is NOT NULL
	}
	got := claim.Control{Key: e.Key}
	var expires sql.NullInt64
	err := s.c.write(ctx, func() error {
		return s.c.stmts.queryRow(ctx, putControl,
			[]any{e.Key, value, e.Version, e.First, expiresMS(e.Expires)},
			&got.Value, &got.Version, &got.First, &expires)
	})
	if err != nil {
		return claim.Control{}, fmt.Errorf("put control %q: %w", e.Key, translate(err))
	}
	if expires.Valid {
		got.Expires = time.UnixMilli(expires.Int64).UTC()
	}
	return got, nil
}

// List implements claim.Controls. It reads without the write lock.
func (s controls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	rows, err := s.c.stmts.query(ctx, listControls, prefix)
	if err != nil {
		return nil, fmt.Errorf("list controls %q: %w", prefix, translate(err))
	}
	defer rows.Close()
	var out []claim.Control
	for rows.Next() {
		var (
			e       claim.Control
			expires sql.NullInt64
		)
		if err := rows.Scan(&e.Key, &e.Value, &e.Version, &e.First, &expires); err != nil {
			return nil, fmt.Errorf("list controls %q: %w", prefix, translate(err))
		}
		if expires.Valid {
			e.Expires = time.UnixMilli(expires.Int64).UTC()
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list controls %q: %w", prefix, translate(err))
	}
	return out, nil
}
