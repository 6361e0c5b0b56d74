//go:build dm

package pullbench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The guest kernel counts CPU time in clock ticks of USER_HZ, which is
// 100 on every Linux architecture the VM runs.
const userHZ = 100

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// namedPID is a process whose CPU time the report shows, by name.
type namedPID struct {
	name string
	pid  int
}

// namedCPU is a process's CPU time, by the name the report shows.
type namedCPU struct {
	name string
	cpu  time.Duration
}

// cpuSnapshot is where the guest's CPU time had gone at one moment: the
// whole machine's (/proc/stat) and that of the processes a pull keeps
// busy (/proc/PID/stat), in the order they were asked for.
type cpuSnapshot struct {
	busy, idle, iowait time.Duration
	procs              []namedCPU
}

// cpuUse is where the guest's CPU time went between two snapshots; the
// caller may add processes measured otherwise (the CLI, a child that has
// exited by then).
type cpuUse cpuSnapshot

// takeCPUSnapshot reads the machine's counters and those of procs.
func takeCPUSnapshot(procs []namedPID) (cpuSnapshot, error) {
	var s cpuSnapshot
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return s, fmt.Errorf("/proc/stat: first line %q is not the machine's cpu line", line)
	}
	for i, v := range f[1:9] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s, fmt.Errorf("/proc/stat: field %d of %q: %w", i+1, line, err)
		}
		switch i {
		case 3:
			s.idle = ticks(n)
		case 4:
			s.iowait = ticks(n)
		default:
			s.busy += ticks(n)
		}
	}
	for _, p := range procs {
		t, err := procCPU(p.pid)
		if err != nil {
			return s, fmt.Errorf("CPU time of %s: %w", p.name, err)
		}
		s.procs = append(s.procs, namedCPU{p.name, t})
	}
	return s, nil
}

// procCPU is a process's user and system time so far, its threads'
// included (fields 14 and 15 of /proc/PID/stat, counted after the
// command name, which may hold spaces and parentheses).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b)[i+1:])
	// f[0] is field 3 (state): utime and stime are f[11] and f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	var sum int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		sum += n
	}
	return ticks(sum), nil
}

// cpuBetween is what each counter of a grew by in b; both were taken of
// the same processes.
func cpuBetween(a, b cpuSnapshot) cpuUse {
	u := cpuUse{busy: b.busy - a.busy, idle: b.idle - a.idle, iowait: b.iowait - a.iowait}
	for i, p := range b.procs {
		u.procs = append(u.procs, namedCPU{p.name, p.cpu - a.procs[i].cpu})
	}
	return u
}

// String is one line of the breakdown: the machine's busy time, what of
// it the named processes had, the rest (the guest kernel's own threads,
// writeback among them, and every other process), and the idle time.
func (u cpuUse) String() string {
	var parts []string
	rest := u.busy
	for _, p := range u.procs {
		parts = append(parts, fmt.Sprintf("%s %s", p.name, secs(p.cpu)))
		rest -= p.cpu
	}
	parts = append(parts, fmt.Sprintf("everything else (the guest kernel's threads, writeback among them) %s", secs(max(rest, 0))))
	return fmt.Sprintf("the guest's CPUs over the pull (/proc/stat): busy %s: %s; idle %s, waiting on I/O %s",
		secs(u.busy), strings.Join(parts, ", "), secs(u.idle), secs(u.iowait))
}
