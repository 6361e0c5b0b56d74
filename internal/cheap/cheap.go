// Package cheap controls the process's C heap and reports SQLite's share
// of it. SQLite is the daemon's only C code, so the C heap is SQLite's:
// its page caches, prepared statements and schema, allocated through
// glibc's malloc. The statistics below are SQLite's own (process-wide);
// the allocator's settings are the process's, so a binary chooses whether
// to apply them (LimitArenas) rather than this package doing so for
// whoever imports it.
package cheap

/*
#include <malloc.h>

extern long long sqlite3_memory_used(void);
extern long long sqlite3_memory_highwater(int resetFlag);
*/
import "C"

// The SQLite library whose figures SQLiteMemory reads is the driver's:
// importing it here links it into every binary that uses this package.
import _ "github.com/mattn/go-sqlite3"

// LimitArenas bounds glibc's malloc arenas to n for the rest of the
// process's life. By default glibc gives each thread that meets
// contention an arena of its own, up to eight per core; Go runs the
// database connections' calls on whichever of its threads is free, so the
// pages a connection frees land in many arenas, each keeping its free
// pieces for itself, and the C heap's resident size becomes a multiple of
// what SQLite holds. It reports whether the allocator took the setting.
func LimitArenas(n int) bool {
	return C.mallopt(C.M_ARENA_MAX, C.int(n)) == 1
}

// SQLiteMemory reports the bytes SQLite's allocator holds now (page
// caches, prepared statements, schema, lookaside; all connections of the
// process) and the most it has held since the process started. This
// memory lives outside Go's heap, so Go's own statistics do not show it.
func SQLiteMemory() (used, highwater int64) {
	return int64(C.sqlite3_memory_used()), int64(C.sqlite3_memory_highwater(0))
}

// Release hands the C heap's free pages back to the system (glibc's
// malloc_trim, over every arena): what SQLite freed stays resident in the
// allocator until then.
func Release() {
	C.malloc_trim(0)
}
