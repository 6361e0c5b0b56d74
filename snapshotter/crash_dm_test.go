//go:build dm

package snapshotter

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// Environment of the crash child (the test binary re-executed).
const (
	envCrashChild = "FLYIO_SNAPSHOTTER_CRASH_CHILD" // scratch dir
	envCrashPool  = "FLYIO_SNAPSHOTTER_CRASH_POOL"
	envCrashRound = "FLYIO_SNAPSHOTTER_CRASH_ROUND"
	crashNS       = "crash"
)

// crashKills is how many times the child is killed (at least 20).
func crashKills() int {
	if v, err := strconv.Atoi(os.Getenv("FLYIO_SNAPSHOTTER_CRASH_KILLS")); err == nil && v > 0 {
		return v
	}
	return 24
}

// TestCrashChild is the process that gets killed: it loops Prepare (writing
// a file), Commit, View and Remove on the shared pool and database, and
// appends to a journal after each call returns. It only runs when
// re-executed by TestCrashSIGKILL.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(envCrashChild)
	if dir == "" {
		t.Skip("only run as the child of TestCrashSIGKILL")
	}
	ctx := nsCtx(crashNS)
	round, _ := strconv.Atoi(os.Getenv(envCrashRound))
	pool, err := thinpool.Open(ctx, poolConfig(dir, os.Getenv(envCrashPool)))
	if err != nil {
		t.Fatal(err)
	}
	db, err := metadata.Open(ctx, metadata.Options{Path: filepath.Join(dir, "meta.db")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(ctx, db, pool, Config{BaseImageSize: testBaseSize, AsyncRemove: round%2 == 0})
	if err != nil {
		t.Fatal(err)
	}
	j, err := os.OpenFile(filepath.Join(dir, "journal"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	note := func(format string, args ...any) {
		if _, err := fmt.Fprintf(j, format+"\n", args...); err != nil {
			t.Fatal(err)
		}
		if err := j.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	// What exists now (the journal of earlier rounds says the same).
	var committed, active []string
	children := map[string]int{}
	if err := s.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Kind == snapshots.KindCommitted {
			committed = append(committed, i.Name)
		} else {
			active = append(active, i.Name)
		}
		if i.Parent != "" {
			children[i.Parent]++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	note("ready %d", round)
	mnt := filepath.Join(dir, "child-mnt")
	os.MkdirAll(mnt, 0o755)
	rng := rand.New(rand.NewPCG(uint64(round), uint64(time.Now().UnixNano())))
	for n := 0; ; n++ {
		switch op := rng.IntN(10); {
		case op < 4 || len(active) == 0: // prepare + write
			key := fmt.Sprintf("a-%d-%d", round, n)
			parent := ""
			if len(committed) > 0 && rng.IntN(3) > 0 {
				parent = committed[rng.IntN(len(committed))]
			}
			content := fmt.Sprintf("%s-%x", key, rng.Uint64())
			note("begin prepare %s", key)
			m, err := s.Prepare(ctx, key, parent)
			if err != nil {
				t.Fatalf("prepare %s: %v", key, err)
			}
			if err := mount.All(m, mnt); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(mnt, "layer-"+key), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := mount.UnmountAll(mnt, 0); err != nil {
				t.Fatal(err)
			}
			note("prepared %s %q %s", key, parent, content)
			active = append(active, key)
			if parent != "" {
				children[parent]++
			}
		case op < 7: // commit
			i := rng.IntN(len(active))
			key := active[i]
			name := "c-" + key
			note("begin commit %s", key)
			if err := s.Commit(ctx, name, key); err != nil {
				t.Fatalf("commit %s: %v", key, err)
			}
			note("committed %s %s", key, name)
			active = append(active[:i], active[i+1:]...)
			committed = append(committed, name)
		default: // remove an active snapshot or a leaf committed one
			var victim string
			var fromCommitted bool
			for _, c := range committed {
				if children[c] == 0 && len(committed) > 4 {
					victim, fromCommitted = c, true
					break
				}
			}
			if victim == "" {
				victim = active[rng.IntN(len(active))]
			}
			st, err := s.Stat(ctx, victim)
			if err != nil {
				t.Fatalf("stat %s: %v", victim, err)
			}
			note("begin remove %s", victim)
			if err := s.Remove(ctx, victim); err != nil {
				t.Fatalf("remove %s: %v", victim, err)
			}
			note("removed %s", victim)
			if st.Parent != "" {
				children[st.Parent]--
			}
			if fromCommitted {
				committed = deleteString(committed, victim)
			} else {
				active = deleteString(active, victim)
			}
		}
		if n%7 == 6 {
			if err := s.Cleanup(ctx); err != nil {
				t.Fatalf("cleanup: %v", err)
			}
		}
	}
}

func deleteString(s []string, v string) []string {
	for i, x := range s {
		if x == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}

// crashModel is what the journal says exists.
type crashModel struct {
	parent   map[string]string // snapshot -> parent name
	content  map[string]string // active key or committed name -> its own layer's content
	layerKey map[string]string // snapshot -> key its layer file was written under
	kind     map[string]snapshots.Kind
	inFlight map[string]string // key -> op begun and not finished when killed
}

func readJournal(t *testing.T, path string) crashModel {
	t.Helper()
	m := crashModel{parent: map[string]string{}, content: map[string]string{}, layerKey: map[string]string{},
		kind: map[string]snapshots.Kind{}, inFlight: map[string]string{}}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 {
			continue
		}
		switch fs[0] {
		case "ready":
			m.inFlight = map[string]string{}
		case "begin":
			m.inFlight[fs[2]] = fs[1]
		case "prepared":
			parent, _ := strconv.Unquote(fs[2])
			m.parent[fs[1]], m.content[fs[1]], m.layerKey[fs[1]], m.kind[fs[1]] = parent, fs[3], fs[1], snapshots.KindActive
			delete(m.inFlight, fs[1])
		case "committed":
			key, name := fs[1], fs[2]
			m.parent[name], m.content[name], m.layerKey[name], m.kind[name] = m.parent[key], m.content[key], m.layerKey[key], snapshots.KindCommitted
			delete(m.parent, key)
			delete(m.content, key)
			delete(m.layerKey, key)
			delete(m.kind, key)
			delete(m.inFlight, key)
		case "removed":
			delete(m.parent, fs[1])
			delete(m.content, fs[1])
			delete(m.layerKey, fs[1])
			delete(m.kind, fs[1])
			delete(m.inFlight, fs[1])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// The daemon-side process is killed with SIGKILL at random points of
// Prepare / Commit / Remove loops; after each restart every snapshot the
// journal says was made still exists with its files, nothing half-made is
// visible through Walk, and at the end the pool's thin ids are exactly the
// database's devices plus the quarantine.
func TestCrashSIGKILL(t *testing.T) {
	e := newTestEnv(t, "ck")
	bg := context.Background()
	ctx := nsCtx(crashNS)
	// Format the base device first (its interruption is covered by
	// TestReconcileRollsBackInterruptedCreate): under emulation mkfs takes
	// longer than most kill delays and every round would die in it.
	warm := e.newSnapshotter(t, Config{AsyncRemove: true})
	if _, err := warm.Prepare(ctx, "warm", ""); err != nil {
		t.Fatal(err)
	}
	if err := warm.Remove(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	if err := warm.Cleanup(bg); err != nil {
		t.Fatal(err)
	}
	e.db.Close()
	e.pool.Close()
	if err := os.WriteFile(filepath.Join(e.dir, "journal"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(42, uint64(time.Now().UnixNano())))
	kills := crashKills()
	verifiedFiles := 0
	for round := 0; round < kills; round++ {
		journal := filepath.Join(e.dir, "journal")
		lines := countLines(journal)
		cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), envCrashChild+"="+e.dir, envCrashPool+"="+e.poolNm, envCrashRound+"="+strconv.Itoa(round))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Kill either during start-up (reconciliation) or after some work.
		var delay time.Duration
		if rng.IntN(5) == 0 {
			delay = time.Duration(rng.IntN(400)) * time.Millisecond
		} else {
			waitReady(t, journal, lines, exited, &out)
			delay = time.Duration(100+rng.IntN(6000)) * time.Millisecond
		}
		select {
		case err := <-exited:
			t.Fatalf("round %d: child exited by itself (%v):\n%s", round, err, out.String())
		case <-time.After(delay):
		}
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		// The mounter (containerd) is not what crashed: release the child's
		// test mount as it would.
		unix.Unmount(filepath.Join(e.dir, "child-mnt"), unix.MNT_DETACH)
		model := readJournal(t, journal)
		t.Logf("round %d: killed after %v; journal: %d snapshots, in flight %v", round, delay, len(model.kind), model.inFlight)

		e.reopen(t)
		s := e.newSnapshotter(t, Config{AsyncRemove: true})
		checkPoolMatchesDB(t, s)
		seen := map[string]snapshots.Info{}
		if err := s.Walk(ctx, func(_ context.Context, i snapshots.Info) error {
			seen[i.Name] = i
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for name, i := range seen {
			if _, inFlight := model.inFlight[name]; inFlight {
				continue
			}
			if committedFrom := strings.TrimPrefix(name, "c-"); committedFrom != name {
				if op := model.inFlight[committedFrom]; op == "commit" {
					continue
				}
			}
			k, ok := model.kind[name]
			if !ok {
				t.Fatalf("round %d: Walk shows %q (%v) which the journal never reported made", round, name, i.Kind)
			}
			if k != i.Kind {
				t.Fatalf("round %d: %q is %v, journal says %v", round, name, i.Kind, k)
			}
		}
		for name, k := range model.kind {
			i, ok := seen[name]
			if !ok {
				if op := model.inFlight[name]; op == "remove" || op == "commit" {
					continue
				}
				t.Fatalf("round %d: %q (%v) reported made but missing after restart", round, name, k)
			}
			if i.Parent != model.parent[name] {
				t.Fatalf("round %d: %q parent %q, journal says %q", round, name, i.Parent, model.parent[name])
			}
		}
		// Every committed snapshot (and its ancestors) holds the files
		// written before its commit.
		for name, k := range model.kind {
			if k != snapshots.KindCommitted {
				continue
			}
			if _, ok := seen[name]; !ok {
				continue
			}
			view := fmt.Sprintf("verify-%d-%s", round, name)
			m, err := s.View(ctx, view, name)
			if err != nil {
				t.Fatalf("round %d: view %s: %v", round, name, err)
			}
			want := map[string]string{}
			for anc := name; anc != ""; anc = model.parent[anc] {
				content, known := model.content[anc]
				if !known {
					t.Fatalf("round %d: ancestor %q of %q unknown to the journal", round, anc, name)
				}
				if content != "-" { // "-": made by a call in flight at a kill, content unknown
					want["layer-"+model.layerKey[anc]] = content
				}
			}
			got := readFiles(t, m, want)
			for f, w := range want {
				if got[f] != w {
					t.Fatalf("round %d: %s: %s = %q, want %q", round, name, f, got[f], w)
				}
				verifiedFiles++
			}
			if err := s.Remove(ctx, view); err != nil {
				t.Fatal(err)
			}
		}
		// Calls in flight at the kill either happened whole or not at all;
		// journal what happened so the next round's model agrees.
		adopt := adoptInFlight(model, seen)
		if err := appendLines(journal, adopt); err != nil {
			t.Fatal(err)
		}
		if err := s.Cleanup(bg); err != nil {
			t.Fatal(err)
		}
		checkPoolMatchesDB(t, s)
		if qs, _ := s.reads().QuarantinedIDs(bg); len(qs) != 0 {
			t.Fatalf("round %d: quarantined ids %+v: something was not explained by an intent", round, qs)
		}
		e.db.Close()
		e.pool.Close()
	}
	e.reopen(t)
	s := e.newSnapshotter(t, Config{AsyncRemove: true})
	checkPoolMatchesDB(t, s)
	if _, err := s.Stat(ctx, "never-made"); !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	t.Logf("crash test: %d SIGKILLs, %d layer files verified after restarts", kills, verifiedFiles)
}

// adoptInFlight returns journal lines recording the outcome of calls in
// flight at the kill, as seen after the restart.
func adoptInFlight(model crashModel, seen map[string]snapshots.Info) []string {
	var lines []string
	for key, op := range model.inFlight {
		switch op {
		case "prepare":
			if i, ok := seen[key]; ok {
				lines = append(lines, fmt.Sprintf("prepared %s %q -", key, i.Parent))
			}
		case "commit":
			if i, ok := seen["c-"+key]; ok && i.Kind == snapshots.KindCommitted {
				lines = append(lines, fmt.Sprintf("committed %s c-%s", key, key))
			}
		case "remove":
			if _, ok := seen[key]; !ok {
				lines = append(lines, "removed "+key)
			}
		}
	}
	return lines
}

func appendLines(path string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readFiles mounts mounts once and returns the content of each file named
// in want.
func readFiles(t *testing.T, mounts []mount.Mount, want map[string]string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	if err := mount.All(mounts, dir); err != nil {
		t.Fatalf("mount %+v: %v", mounts, err)
	}
	got := map[string]string{}
	for f := range want {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			got[f] = "<" + err.Error() + ">"
			continue
		}
		got[f] = string(b)
	}
	if err := mount.UnmountAll(dir, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	return got
}

func countLines(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// waitReady waits until the child journals "ready" after line skip.
func waitReady(t *testing.T, journal string, skip int, exited chan error, out *strings.Builder) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(journal)
		lines := strings.Split(string(b), "\n")
		for _, l := range lines[min(skip, len(lines)):] {
			if strings.HasPrefix(l, "ready ") {
				return
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("child exited before ready (%v):\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("child never became ready")
}
