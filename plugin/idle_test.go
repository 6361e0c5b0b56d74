package plugin

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metrics"
)

// TestMetricsEndpointClosesIdleConnections: the metrics endpoint listens
// on TCP (daemon.metrics_address, often an address other hosts reach), so
// a client that scrapes once and then keeps its connection open without
// sending anything must not hold the connection, its descriptor and its
// goroutine in the daemon for ever.
func TestMetricsEndpointClosesIdleConnections(t *testing.T) {
	mlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	startServe(t, newNative(t), ServeOptions{Socket: filepath.Join(t.TempDir(), "s.sock"), MetricsListener: mlis, Metrics: metrics.New()})
	c, err := net.Dial("tcp", mlis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: metrics\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	const wait = 15 * time.Second
	c.SetReadDeadline(time.Now().Add(wait))
	_, err = br.ReadByte()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the metrics endpoint still holds an idle connection %v after its last answer", wait)
	}
	if err != io.EOF {
		t.Logf("idle connection ended with %v", err)
	}
}
