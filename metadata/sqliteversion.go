package metadata

/*
extern const char *sqlite3_libversion(void);
*/
import "C"

// SQLiteVersion returns the version of the SQLite library linked into the
// binary (such as "3.50.4"): the one that reads and writes the database
// file, whatever the Go driver's version.
func SQLiteVersion() string {
	return C.GoString(C.sqlite3_libversion())
}
