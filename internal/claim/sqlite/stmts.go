package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"sync"
)

// stmts prepares each query once per Claimer: parsing is a large part of the
// cost of the short statements a claimer runs. database/sql prepares a
// statement again on each connection that needs it.
type stmts struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

func (s *stmts) get(ctx context.Context, query string) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.m[query]; ok {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if s.m == nil {
		s.m = map[string]*sql.Stmt{}
	}
	s.m[query] = st
	return st, nil
}

func (s *stmts) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for q, st := range s.m {
		errs = append(errs, st.Close())
		delete(s.m, q)
	}
	return errors.Join(errs...)
}

func (s *stmts) queryRow(ctx context.Context, query string, args []any, dest ...any) error {
	st, err := s.get(ctx, query)
	if err != nil {
		return err
	}
	return st.QueryRowContext(ctx, args...).Scan(dest...)
}

func (s *stmts) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := s.get(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (s *stmts) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := s.get(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// inTx runs f in one write transaction (BEGIN IMMEDIATE, through the DSN's
// _txlock) with the cached statements bound to it, and commits it; any
// error of f rolls it back.
func (s *stmts) inTx(ctx context.Context, f func(stmt func(query string) (*sql.Stmt, error)) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	err = f(func(query string) (*sql.Stmt, error) {
		st, err := s.get(ctx, query)
		if err != nil {
			return nil, err
		}
		return tx.StmtContext(ctx, st), nil
	})
	if err != nil {
		return err
	}
	return tx.Commit()
}
