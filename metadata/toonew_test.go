package metadata

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestSchemaTooNewNamesACopyThatExists: a newer binary (two migrations
// more) migrates a database at version 12, copying it to <db>.pre-v13
// first. This binary then refuses the database and names the copy to
// restore: that copy must exist, and be one this binary can open.
func TestSchemaTooNewNamesACopyThatExists(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	d, err := Open(ctx, Options{Path: path, MigrateTo: LatestVersion() - 1})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()

	ours := embedded
	defer func() { embedded = ours }()
	newer := Migrations()
	for _, v := range []int{len(newer) + 1, len(newer) + 2} {
		sql := "CREATE TABLE future_" + string(rune('a'+v%26)) + " (x INTEGER);"
		newer = append(newer, Migration{Version: v, Name: "future", SQL: sql, SHA256: hashSQL(sql), Description: "future"})
	}
	embedded = func() []Migration { return newer }
	d, err = Open(ctx, Options{Path: path})
	if err != nil {
		t.Fatalf("the newer binary's open: %v", err)
	}
	d.Close()
	embedded = ours

	_, err = Open(ctx, Options{Path: path})
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("open of the newer database: %v, want ErrSchemaTooNew", err)
	}
	m := regexp.MustCompile(`restore (\S+\.pre-v\d+)`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("the refusal names no copy to restore: %v", err)
	}
	if _, serr := os.Stat(m[1]); serr != nil {
		copies, _ := filepath.Glob(path + ".pre-v*")
		t.Fatalf("the refusal names %s to restore: %v (copies there: %v)", m[1], serr, copies)
	}
}
