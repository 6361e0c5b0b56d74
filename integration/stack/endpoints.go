package stack

import (
	"regexp"
	"strconv"
	"strings"
)

// AnyLoopbackPort is a listen address for a daemon's HTTP endpoint
// (daemon.metrics_address, daemon.debug_address) that lets the kernel pick
// the port as the daemon binds it. A port picked free by the harness and
// handed over can be taken by any socket bound or connected in between,
// and the daemon then exits at start-up; the address bound is read back
// from the daemon's log with ServedEndpoints.
const AnyLoopbackPort = "127.0.0.1:0"

// servingLine is the message the daemon logs once every listener is bound.
const servingLine = `msg="serving snapshots API"`

// endpointField is one name=value field of a logfmt line, the value quoted
// or bare.
var endpointField = regexp.MustCompile(`(?:^|\s)(metrics|debug)=("(?:[^"\\]|\\.)*"|\S+)`)

// ServedEndpoints reads the addresses the daemon's HTTP endpoints are bound
// to ("metrics", "debug") from the last "serving snapshots API" line of
// log, the text of its log in the default text format; ok is false while
// no such line is there.
func ServedEndpoints(log string) (eps map[string]string, ok bool) {
	i := strings.LastIndex(log, servingLine)
	if i < 0 {
		return nil, false
	}
	start := strings.LastIndexByte(log[:i], '\n') + 1
	line, _, _ := strings.Cut(log[start:], "\n")
	eps = map[string]string{}
	for _, m := range endpointField.FindAllStringSubmatch(line, -1) {
		v := m[2]
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		eps[m[1]] = v
	}
	return eps, true
}
