// Package flock takes the flock(2) locks by which the project's processes
// tell a live holder from a dead one: the kernel drops a lock with the
// last descriptor of its open file, so a process killed with -9 holds
// none. It imports nothing of the project, so any package may use it.
package flock

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// TryLock takes f's exclusive flock without waiting. A lock another open
// file description holds (another process's, or another open of the same
// file) fails it with an error matching unix.EWOULDBLOCK; a signal that
// interrupts the call is no answer, and the call is made again. The lock
// lasts until f is closed.
func TryLock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
