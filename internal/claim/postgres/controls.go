package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/scheduler-dev/scheduler/internal/claim"
)

// The operator's state (claim.Controls: pauses, run requests) lives in the
// scheduler_controls table, beside scheduler_runs in the same schema, so
// every replica that shares the runs sees the same pauses and requests
// without another store to configure. Expiry is judged on the database's
// clock, as leases are.
const (
	// controlWins is whether the new entry (excluded) replaces the stored
	// one (s) in an upsert: s expired, on the database clock, or
	// claim.Control.Wins (never with first, else a higher version).
	controlWins = `(
       (s.expires_at IS NOT NULL AND s.expires_at <= now())
    OR (NOT excluded.first AND excluded.version > s.version))`

	// putControl stores an entry unless the key holds one that wins over
	// it, and returns what the key holds afterwards, in one statement: the
	// update of a losing entry writes the stored values back, so RETURNING
	// always has the row, read under its lock. (With DO UPDATE ... WHERE,
	// a losing put would return nothing, and a read in the same statement
	// sees its snapshot, which may predate the row it lost to.)
	putControl = `
INSERT INTO scheduler_controls AS s (key, value, version, first, expires_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (key) DO UPDATE
   SET value      = CASE WHEN ` + controlWins + ` THEN excluded.value ELSE s.value END,
       version    = CASE WHEN ` + controlWins + ` THEN excluded.version ELSE s.version END,
       first      = CASE WHEN ` + controlWins + ` THEN excluded.first ELSE s.first END,
       expires_at = CASE WHEN ` + controlWins + ` THEN excluded.expires_at ELSE s.expires_at END
RETURNING value, version, first, expires_at`

	// listControls: key is COLLATE "C", so the range and the order are
	// bytewise, as in Go; the range lets the primary key find the first
	// match.
	listControls = `
SELECT key, value, version, first, expires_at FROM scheduler_controls
 WHERE key >= $1 AND starts_with(key, $1) AND (expires_at IS NULL OR expires_at > now())
 ORDER BY key`
)

// Controls returns the register of operator state on c's pool, usable
// while the pool is open.
func (c *Claimer) Controls() claim.Controls { return controls{c.pool} }

type controls struct{ pool *pgxpool.Pool }

var _ claim.Controls = controls{}

// Put implements claim.Controls in one statement.
func (s controls) Put(ctx context.Context, e claim.Control) (claim.Control, error) {
	got, errs := s.PutBatch(ctx, []claim.Control{e})
	return got[0], errs[0]
}

// PutBatch implements claim.BatchPutter: Put's statement for each entry,
// all in one batch (one round trip), in key order, so that two replicas'
// batches over the same keys lock their rows in the same order and never
// deadlock. The batch is one implicit transaction: an error fails every
// entry of it.
func (s controls) PutBatch(ctx context.Context, cs []claim.Control) ([]claim.Control, []error) {
	out := make([]claim.Control, len(cs))
	errs, valid := claim.CheckControls(ctx, cs)
	valid = slices.DeleteFunc(valid, func(i int) bool {
		if !utf8.ValidString(cs[i].Key) { // text rejects it
			errs[i] = fmt.Errorf("%w: control key %q is not UTF-8", claim.ErrInvalid, cs[i].Key)
			return true
		}
		return false
	})
	if len(valid) == 0 {
		return out, errs
	}
	slices.SortStableFunc(valid, func(a, b int) int { return strings.Compare(cs[a].Key, cs[b].Key) })
	stored := make([]*time.Time, len(cs))
	batch := &pgx.Batch{}
	for _, i := range valid {
		e := cs[i]
		value := e.Value
		if value == nil {
			value = []byte{} // the column is NOT NULL
		}
		var expires *time.Time
		if !e.Expires.IsZero() {
			expires = &e.Expires
		}
		out[i].Key = e.Key
		batch.Queue(putControl, e.Key, value, e.Version, e.First, expires).QueryRow(func(row pgx.Row) error {
			return row.Scan(&out[i].Value, &out[i].Version, &out[i].First, &stored[i])
		})
	}
	err := s.pool.SendBatch(ctx, batch).Close()
	for _, i := range valid {
		switch {
		case err != nil:
			out[i], errs[i] = claim.Control{}, fmt.Errorf("put control %q: %w", cs[i].Key, translate(err))
		case stored[i] != nil:
			out[i].Expires = stored[i].UTC()
		}
	}
	return out, errs
}

// List implements claim.Controls.
func (s controls) List(ctx context.Context, prefix string) ([]claim.Control, error) {
	if !utf8.ValidString(prefix) {
		return nil, fmt.Errorf("%w: control prefix %q is not UTF-8", claim.ErrInvalid, prefix)
	}
	rows, err := s.pool.Query(ctx, listControls, prefix)
	if err != nil {
		return nil, fmt.Errorf("list controls %q: %w", prefix, translate(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claim.Control, error) {
		var (
			e       claim.Control
			expires *time.Time
		)
		err := row.Scan(&e.Key, &e.Value, &e.Version, &e.First, &expires)
		if expires != nil {
			e.Expires = expires.UTC()
		}
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list controls %q: %w", prefix, translate(err))
	}
	return out, nil
}
