package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serveEnv makes this test binary a server: it listens on the address the
// variable holds and serves until killed, or exits 1 with the bind's error,
// as versitygw and the registry do.
const serveEnv = "STACK_TEST_SERVE"

func TestMain(m *testing.M) {
	if addr := os.Getenv(serveEnv); addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "listen:", err)
			os.Exit(1)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(1)
			}
			c.Close()
		}
	}
	os.Exit(m.Run())
}

// serveWith starts this binary as a server on addr with its log in dir.
func serveWith(ctx context.Context, dir, addr string) (*Proc, error) {
	return StartServing(ctx, "server", filepath.Join(dir, "server.log"), append(os.Environ(), serveEnv+"="+addr), "tcp", addr, os.Args[0])
}

func TestServeOnFreePortRetriesATakenPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	var tried []string
	p, addr, err := ServeOnFreePort(ctx, func(addr string) (*Proc, error) {
		tried = append(tried, addr)
		if len(tried) == 1 {
			// Another socket binds the port, without listening, before
			// the server binds it: the server exits, and nothing answers.
			fd, err := bindOnly(addr)
			if err != nil {
				return nil, err
			}
			defer syscall.Close(fd)
		}
		return serveWith(ctx, dir, addr)
	})
	if err != nil {
		t.Fatalf("ServeOnFreePort: %v", err)
	}
	defer p.Kill()
	if len(tried) != 2 || addr != tried[1] || tried[0] == tried[1] {
		t.Fatalf("ports tried %v, serving on %s: want the taken port given up for a second one", tried, addr)
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("the server does not answer on %s: %v", addr, err)
	}
	c.Close()
	log, err := p.RunLog()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log, "address already in use") {
		t.Errorf("the serving run's log holds the first run's failure:\n%s", log)
	}
	if all, err := os.ReadFile(p.LogPath); err != nil || !strings.Contains(string(all), "address already in use") {
		t.Errorf("the first run did not fail on the taken port (%v):\n%s", err, all)
	}
}

func TestServeOnFreePortGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()

	t.Run("every port taken by a listener", func(t *testing.T) {
		starts := 0
		_, _, err := ServeOnFreePort(ctx, func(addr string) (*Proc, error) {
			starts++
			// This one accepts the connection the start waits for.
			l, err := net.Listen("tcp", addr)
			if err != nil {
				return nil, fmt.Errorf("take %s: %w", addr, err)
			}
			defer l.Close()
			return serveWith(ctx, dir, addr)
		})
		if !errors.Is(err, errPortTaken) || starts != portAttempts {
			t.Fatalf("after %d starts: %v; want %d starts and an error saying the address was in use", starts, err, portAttempts)
		}
	})

	t.Run("another failure", func(t *testing.T) {
		starts := 0
		_, _, err := ServeOnFreePort(ctx, func(addr string) (*Proc, error) {
			starts++
			// An address the server cannot parse: it exits at once, for a
			// reason a new port does not cure.
			return serveWith(ctx, dir, "no-such-host-or-port")
		})
		if err == nil || errors.Is(err, errPortTaken) || starts != 1 {
			t.Fatalf("after %d starts: %v; want one start and the server's own failure", starts, err)
		}
	})

	t.Run("a canceled context", func(t *testing.T) {
		canceled, cancelNow := context.WithCancel(ctx)
		cancelNow()
		starts := 0
		_, _, err := ServeOnFreePort(canceled, func(addr string) (*Proc, error) {
			starts++
			return serveWith(ctx, dir, addr)
		})
		if !errors.Is(err, context.Canceled) || starts != 0 {
			t.Fatalf("after %d starts: %v; want no start and the context's error", starts, err)
		}
	})
}

// bindOnly binds a TCP socket to addr without listening, as a connection's
// local end does, and returns it.
func bindOnly(addr string) (int, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return -1, err
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		syscall.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", addr, err)
	}
	return fd, nil
}
