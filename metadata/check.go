package metadata

import (
	"context"
	"fmt"
)

// CheckReport is the outcome of (*DB).Check: empty Problems means healthy.
type CheckReport struct {
	SchemaVersion int      // highest version in the ledger
	LatestVersion int      // highest version this binary embeds
	Problems      []string // one line per problem found
}

// OK reports whether the check found no problem.
func (r CheckReport) OK() bool { return len(r.Problems) == 0 }

// Check verifies the database without changing it: SQLite's integrity_check
// (pages, indexes, CHECK and NOT NULL constraints), foreign_key_check (rows
// whose parent is missing), and the migration ledger against the embedded
// migrations (hashes, gaps, a schema older or newer than this binary). The
// error is for failures to run the checks; what they find is in Problems.
func (d *DB) Check(ctx context.Context) (CheckReport, error) {
	rep := CheckReport{LatestVersion: LatestVersion()}

	msgs, err := queryAll(ctx, d.db, "integrity_check of "+d.path, func(s rowScanner) (string, error) {
		var m string
		err := s.Scan(&m)
		return m, err
	}, `PRAGMA integrity_check`)
	if err != nil {
		return rep, err
	}
	if !(len(msgs) == 1 && msgs[0] == "ok") {
		for _, m := range msgs {
			rep.Problems = append(rep.Problems, "integrity_check: "+m)
		}
	}

	orphans, err := queryAll(ctx, d.db, "foreign_key_check of "+d.path, func(s rowScanner) (string, error) {
		var (
			table, parent string
			rowid         *int64
			fkid          int64
		)
		err := s.Scan(&table, &rowid, &parent, &fkid)
		row := "without rowid"
		if rowid != nil {
			row = fmt.Sprintf("rowid %d", *rowid)
		}
		return fmt.Sprintf("foreign_key_check: %s %s references a missing row of %s (foreign key %d)", table, row, parent, fkid), err
	}, `PRAGMA foreign_key_check`)
	if err != nil {
		return rep, err
	}
	rep.Problems = append(rep.Problems, orphans...)

	ledger, err := readLedger(ctx, d.db)
	if err != nil {
		return rep, fmt.Errorf("metadata: %s: %w", d.path, err)
	}
	if len(ledger) > 0 {
		rep.SchemaVersion = ledger[len(ledger)-1].Version
	}
	if err := checkLedger(ledger, false); err != nil {
		rep.Problems = append(rep.Problems, "ledger: "+err.Error())
	}
	if rep.SchemaVersion < rep.LatestVersion {
		rep.Problems = append(rep.Problems, fmt.Sprintf("ledger: schema is at version %d, this binary's latest is %d (run 'db migrate' or start the daemon)", rep.SchemaVersion, rep.LatestVersion))
	}
	return rep, nil
}
