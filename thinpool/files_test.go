package thinpool

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/internal/conf"
)

// TestEnsureFilesAfterKillDuringCreation: a process killed between
// creating a loop file and sizing it leaves the file at 0 bytes under its
// final name. The next Open must still get a data file of pool.data_size
// and a metadata file of pool.metadata_size, not take the empty file as
// the pool's (a 0-byte data file is refused as smaller than one block on
// every start after, and a 0-byte metadata file cannot hold a pool).
func TestEnsureFilesAfterKillDuringCreation(t *testing.T) {
	for _, left := range []string{DataFileName, MetadataFileName} {
		t.Run(left, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Name: "p", RootDir: dir, DataSize: conf.Size(64 << 20), MetadataSize: conf.Size(4 << 20)}.withDefaults()
			// What the kill left: the file created (O_CREAT|O_EXCL), never sized.
			if err := os.WriteFile(filepath.Join(dir, left), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			p := &Pool{cfg: cfg, name: cfg.Name}
			metaFile, dataFile, err := p.ensureFiles(context.Background())
			if err != nil {
				t.Fatalf("ensureFiles after a creation cut short: %v", err)
			}
			for path, want := range map[string]int64{dataFile: cfg.DataSize.Bytes(), metaFile: cfg.MetadataSize.Bytes()} {
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Size() != want {
					t.Errorf("%s holds %d bytes after ensureFiles, want %d", path, fi.Size(), want)
				}
			}
		})
	}
}
