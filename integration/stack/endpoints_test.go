package stack

import "testing"

func TestServedEndpoints(t *testing.T) {
	const first = `time="2026-11-28T02:39:56Z" level=info msg="serving snapshots API" debug="127.0.0.1:40001" diff=true metrics="127.0.0.1:40002" socket=/run/a.sock` + "\n"
	const second = `time="2026-11-28T02:40:56Z" level=info msg="serving snapshots API" diff=true metrics="[::1]:40003" socket=/run/a.sock` + "\n"
	if _, ok := ServedEndpoints(`time="x" level=info msg="service opened"` + "\n"); ok {
		t.Error("a log without the serving line reports endpoints")
	}
	eps, ok := ServedEndpoints(first)
	if !ok || eps["metrics"] != "127.0.0.1:40002" || eps["debug"] != "127.0.0.1:40001" {
		t.Errorf("one run: %v, %v", eps, ok)
	}
	eps, ok = ServedEndpoints(first + `time="y" level=info msg=stopped` + "\n" + second + `time="z" level=info msg="pull done"`)
	if !ok || eps["metrics"] != "[::1]:40003" || eps["debug"] != "" {
		t.Errorf("the later of two runs: %v, %v", eps, ok)
	}
}
