package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestIdleConnectionsAreClosed: a client that sends one request on a
// keep-alive connection and then neither sends another nor closes it
// (curl --unix-socket left in a shell, a hung script) must not hold a
// descriptor and a goroutine in the daemon until it stops.
func TestIdleConnectionsAreClosed(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Serve(ctx, lis, &slowActivate{entered: make(chan struct{})})
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /v1/activate HTTP/1.1\r\nHost: control\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	const wait = 15 * time.Second
	c.SetReadDeadline(time.Now().Add(wait))
	if _, err := br.ReadByte(); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the control socket still holds an idle connection %v after its last answer", wait)
	}
}
