package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestListenUnixTwoStartsOneWins: two daemons started together on one
// socket path (two configurations naming the same daemon.socket): one of
// them must be refused. If both got a listener, the second's rename has
// silently taken the path from the first, which runs on unreachable.
func TestListenUnixTwoStartsOneWins(t *testing.T) {
	gid := os.Getgid()
	for i := range 200 {
		path := filepath.Join(t.TempDir(), "s.sock")
		var wg sync.WaitGroup
		var lis [2]net.Listener
		start := make(chan struct{})
		for j := range lis {
			wg.Go(func() {
				<-start
				lis[j], _ = ListenUnix(context.Background(), path, SocketMode, gid)
			})
		}
		close(start)
		wg.Wait()
		both := lis[0] != nil && lis[1] != nil
		for _, l := range lis {
			if l != nil {
				l.Close()
			}
		}
		if both {
			t.Fatalf("attempt %d: both starts got a listener on %s: the later one replaced the earlier one's socket", i, path)
		}
	}
}
