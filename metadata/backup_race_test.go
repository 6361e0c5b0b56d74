package metadata

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestPreMigrationCopyIsOfThePreviousVersion: process A migrates a
// version-7 database; process B opens it while A is inside migration 8,
// so B too reads version 7 from the ledger. Once A has migrated, B must
// not replace A's copy <db>.pre-v8 with one of the migrated database: the
// copy named pre-v8 is the way back, and holds version 7.
func TestPreMigrationCopyIsOfThePreviousVersion(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	d, err := Open(ctx, Options{Path: path, MigrateTo: 7})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()

	var (
		once sync.Once
		bErr error
		b    *DB
		wg   sync.WaitGroup
	)
	migrationHook = func(v int) {
		if v != 8 {
			return
		}
		once.Do(func() {
			// A holds the write lock, migration 8 not committed: B reads
			// version 7, then waits for the lock.
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, bErr = Open(ctx, Options{Path: path, BusyTimeout: 30 * time.Second})
			}()
			time.Sleep(500 * time.Millisecond)
		})
	}
	defer func() { migrationHook = nil }()
	a, err := Open(ctx, Options{Path: path, BusyTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("A: %v", err)
	}
	defer a.Close()
	wg.Wait()
	if bErr != nil {
		t.Fatalf("B: %v", bErr)
	}
	defer b.Close()
	if a.Migrated().Backup != path+".pre-v8" {
		t.Fatalf("A migrated %+v", a.Migrated())
	}
	c := openReadOnlyAtVersion(t, path+".pre-v8", 7, "the copy "+path+".pre-v8 after A's and B's opens (B: "+b.Migrated().Backup+")")
	c.Close()
	if left, _ := filepath.Glob(path + ".pre-v*[-_]*"); len(left) != 0 {
		t.Errorf("files left beside the copies: %v", left)
	}
}
