package metadata

import (
	"context"
	"database/sql"
	"fmt"
)

// QueryAll runs query on q (a *sql.DB, *sql.Tx, *sql.Conn or Querier) and
// returns what scan reads from each row, in the order SQLite returns them.
// Its errors are the driver's and scan's, not wrapped: the caller knows
// what the query was for and says so.
func QueryAll[T any](ctx context.Context, q interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}, scan func(*sql.Rows) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

type rowScanner interface{ Scan(dest ...any) error }

// queryAll is QueryAll with errors wrapped with what (the operation, for
// the message).
func queryAll[T any](ctx context.Context, q queryer, what string, scan func(rowScanner) (T, error), query string, args ...any) ([]T, error) {
	out, err := QueryAll(ctx, q, func(r *sql.Rows) (T, error) { return scan(r) }, query, args...)
	if err != nil {
		return nil, fmt.Errorf("metadata: %s: %w", what, err)
	}
	return out, nil
}
