package metadata

import (
	"context"
	"fmt"
)

// queryAll runs query on q and scans every row with scan; errors are wrapped
// with what (the operation, for the message).
func queryAll[T any](ctx context.Context, q queryer, what string, scan func(rowScanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("metadata: %s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("metadata: %s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("metadata: %s: %w", what, err)
	}
	return out, nil
}
