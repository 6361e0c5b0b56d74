package metadata

// The SQLite library linked into the binary is go-sqlite3's (or the
// system's, with its libsqlite3 build tag); either way its memory
// statistics are process-wide, kept by SQLite's own allocator wrapper.

/*
extern long long sqlite3_memory_used(void);
extern long long sqlite3_memory_highwater(int resetFlag);
*/
import "C"

// SQLiteMemory reports the bytes SQLite's allocator holds now (page
// caches, prepared statements, schema, lookaside; all connections of the
// process) and the most it has held since the process started. This
// memory lives outside Go's heap, so Go's own statistics do not show it.
func SQLiteMemory() (used, highwater int64) {
	return int64(C.sqlite3_memory_used()), int64(C.sqlite3_memory_highwater(0))
}
