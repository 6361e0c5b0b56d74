//go:build dm

package containerdtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

// crashModel is what the client was told: committed snapshots (Commit
// returned nil) with the files their chain holds, active snapshots
// (Prepare returned nil), and the call in flight when the daemon died.
type crashModel struct {
	committed map[string]crashSnap // name -> snapshot
	active    map[string]crashSnap // key -> snapshot being built
	inFlight  crashOp
}

type crashSnap struct {
	parent string
	files  map[string]string // path in the snapshot -> content
}

type crashOp struct {
	op, key, target string // "prepare", "commit", "remove", "cleanup"; target: commit name
	snap            crashSnap
}

// crashKills is FLYIO_IT_CRASH_KILLS or 20 (the fewest that make the crash test worth its time).
func crashKills(t *testing.T) int {
	n := 20
	if v := os.Getenv("FLYIO_IT_CRASH_KILLS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("FLYIO_IT_CRASH_KILLS=%q: want a positive count", v)
		}
	}
	return n
}

// TestCrashOverSocket is the crash test driven the way containerd
// drives us: over the daemon's socket with containerd's proxy snapshotter
// client. `containerd-flyio-snapshotter serve` is killed with SIGKILL at
// random points of a Prepare (+ write a file) / Commit / Remove / Cleanup
// loop, at least 20 times, and restarted. After every restart: each
// snapshot whose Commit returned nil still exists, committed, with every
// file of its chain; each key whose Prepare returned nil is still usable;
// Walk shows nothing else than those and the outcome of the one call in
// flight (which must itself be whole: mountable, with its files); and
// `pool ls --check` finds the pool's thin ids and the database's device
// records in agreement. At the end everything is removed, Cleanup runs,
// and the pool holds at most the base device.
func TestCrashOverSocket(t *testing.T) {
	repo, scratch, _, err := stack.VMEnv()
	if err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), "crash")
	dir := filepath.Join(scratch, "crash")
	d, err := startOurDaemon(ctx, repo, dir, "flyio-crash-pool")
	if err != nil {
		t.Fatal(err)
	}
	defer d.stopAndLog()
	mnt := filepath.Join(dir, "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}

	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("FLYIO_IT_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("crash test seed %d (FLYIO_IT_CRASH_SEED to repeat)", seed)
	rng := rand.New(rand.NewPCG(seed, 1))

	model := crashModel{committed: map[string]crashSnap{}, active: map[string]crashSnap{}}
	kills := crashKills(t)
	var ops, verifiedFiles int
	killedIn := map[string]int{}

	// Warm-up without kills: the pool's base device gets made, and the
	// time one loop step takes here (TCG, shared cores) is measured, so the
	// kills land inside the loop whatever the machine's speed.
	sn, closeConn := dialOurs(t, d)
	var warm time.Time
	for i := 0; i < 4; i++ {
		if i == 1 { // the first step also makes the base device
			warm = time.Now()
		}
		if err := crashBuild(ctx, sn, &model, rng, mnt, fmt.Sprintf("warm-%d", i)); err != nil {
			t.Fatalf("warm-up: %v\ndaemon log tail:\n%s", err, d.p.LogTail(40))
		}
	}
	if err := crashRemove(ctx, sn, &model, rng); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	closeConn()
	stepTime := time.Since(warm) / 4
	var loopTime time.Duration
	t.Logf("warm-up: %s per Prepare+write+Commit step", stepTime.Round(time.Millisecond))
	start := time.Now()
	for k := 0; k < kills; k++ {
		sn, closeConn := dialOurs(t, d)
		// Kill after a random delay within the next few loop steps.
		delay := time.Duration(rng.Int64N(int64(4 * stepTime)))
		killing, killed := make(chan struct{}), make(chan struct{})
		timer := time.AfterFunc(delay, func() { close(killing); d.p.Kill(); close(killed) })
		loopStart := time.Now()
		n, err := crashLoop(ctx, sn, &model, rng, mnt, k)
		ops += n
		loopTime += time.Since(loopStart)
		select {
		case <-killing:
		default:
			// The call failed while the daemon was alive: a real error.
			timer.Stop()
			t.Fatalf("iteration %d: %s of %q failed before any kill: %v\ndaemon log tail:\n%s", k, model.inFlight.op, model.inFlight.key, err, d.p.LogTail(40))
		}
		<-killed
		timer.Stop()
		closeConn()
		killedIn[model.inFlight.op]++

		if err := d.start(ctx); err != nil {
			t.Fatalf("iteration %d: restart after SIGKILL: %v", k, err)
		}
		sn, closeConn = dialOurs(t, d)
		v, err := verifyCrashModel(ctx, sn, &model, mnt)
		closeConn()
		if err != nil {
			t.Fatalf("iteration %d (killed during %s of %q after %s): %v\ndaemon log tail:\n%s", k, model.inFlight.op, model.inFlight.key, delay, err, d.p.LogTail(40))
		}
		verifiedFiles += v
		t.Logf("kill %d after %s during %s of %q: restarted, %d committed and %d active verified (%d files)",
			k+1, delay, model.inFlight.op, model.inFlight.key, len(model.committed), len(model.active), v)
		if out, err := stack.Run(ctx, nil, d.bin, "pool", "ls", "--check", "--config", d.config); err != nil {
			t.Fatalf("iteration %d: pool and database disagree after restart: %v\n%s", k, err, out)
		}
	}
	t.Logf("crash test: %d SIGKILLs (call in flight at each kill: %v), %d loop steps completed between kills in %s, %d files verified after restarts, %s in all",
		kills, killedIn, ops, loopTime.Round(time.Millisecond), verifiedFiles, time.Since(start).Round(time.Second))
	if killedIn["prepare"] == 0 || killedIn["commit"] == 0 {
		t.Errorf("no kill landed in a Prepare or in a Commit (%v): the kill points do not cover the loop", killedIn)
	}

	// Remove everything, children first, then let Cleanup reclaim.
	sn, closeConn = dialOurs(t, d)
	defer closeConn()
	for key := range model.active {
		if err := sn.Remove(ctx, key); err != nil {
			t.Fatalf("final remove of active %s: %v", key, err)
		}
	}
	model.active = map[string]crashSnap{}
	for len(model.committed) > 0 {
		for _, name := range leaves(model) {
			if err := sn.Remove(ctx, name); err != nil {
				t.Fatalf("final remove of %s: %v", name, err)
			}
			delete(model.committed, name)
		}
	}
	if c, ok := sn.(snapshots.Cleaner); ok {
		if err := c.Cleanup(ctx); err != nil {
			t.Fatalf("final cleanup: %v", err)
		}
	}
	var left []string
	if err := sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error { left = append(left, i.Name); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("Walk shows %v after removing everything", left)
	}
	out, err := stack.Run(ctx, nil, d.bin, "pool", "ls", "--check", "--config", d.config)
	if err != nil {
		t.Fatalf("pool and database disagree at the end: %v\n%s", err, out)
	}
	ids, err := d.thinIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) > 1 {
		t.Fatalf("pool still holds thin devices %v after everything was removed and cleaned up; pool ls:\n%s", ids, out)
	}
	t.Logf("end: pool ls --check agrees; pool holds %v\n%s", ids, out)
}

// dialOurs connects containerd's proxy snapshotter client to the daemon.
func dialOurs(t *testing.T, d *ourDaemon) (snapshots.Snapshotter, func()) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", d.socket, err)
	}
	return proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), "flyio"), func() { conn.Close() }
}

// leaves returns the committed snapshots that no snapshot (committed or
// active) has as parent, sorted.
func leaves(m crashModel) []string {
	parents := map[string]bool{}
	for _, s := range m.committed {
		parents[s.parent] = true
	}
	for _, s := range m.active {
		parents[s.parent] = true
	}
	var out []string
	for name := range m.committed {
		if !parents[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// crashLoop runs random operations until one fails (the daemon was
// killed), recording each outcome in m and the failing call in
// m.inFlight. It returns the number of calls that succeeded.
func crashLoop(ctx context.Context, sn snapshots.Snapshotter, m *crashModel, rng *rand.Rand, mnt string, iter int) (int, error) {
	for n := 0; ; n++ {
		// Remove when the model is big (it is all re-read after each
		// restart), else mostly build.
		r := rng.IntN(10)
		switch {
		case len(m.committed) > 6, len(m.committed) > 3 && r < 4, r == 0:
			if err := crashRemove(ctx, sn, m, rng); err != nil {
				return n, err
			}
		case r == 1:
			m.inFlight = crashOp{op: "cleanup"}
			if c, ok := sn.(snapshots.Cleaner); ok {
				if err := c.Cleanup(ctx); err != nil {
					return n, err
				}
			}
		default:
			if err := crashBuild(ctx, sn, m, rng, mnt, fmt.Sprintf("%d-%d", iter, n)); err != nil {
				return n, err
			}
		}
	}
}

// crashBuild prepares a snapshot on a random committed parent (or none),
// writes one file into it, and commits it.
func crashBuild(ctx context.Context, sn snapshots.Snapshotter, m *crashModel, rng *rand.Rand, mnt, tag string) error {
	parent := ""
	if names := sortedKeys(m.committed); len(names) > 0 && rng.IntN(4) != 0 {
		parent = names[rng.IntN(len(names))]
	}
	key, name := "active-"+tag, "layer-"+tag
	s := crashSnap{parent: parent, files: map[string]string{}}
	for p, c := range m.committed[parent].files {
		s.files[p] = c
	}
	file := "/file-" + tag
	s.files[file] = "written into " + key + "\n"

	m.inFlight = crashOp{op: "prepare", key: key, snap: s}
	mounts, err := sn.Prepare(ctx, key, parent)
	if err != nil {
		return err
	}
	// Prepare returned: the key exists for the client. Its file is not
	// written yet; the model only counts files once Commit returns.
	m.active[key] = crashSnap{parent: parent, files: m.committed[parent].files}
	if err := mount.All(mounts, mnt); err != nil {
		return fmt.Errorf("mount %s: %w", key, err)
	}
	werr := os.WriteFile(filepath.Join(mnt, file), []byte(s.files[file]), 0o644)
	if err := mount.UnmountAll(mnt, 0); err != nil {
		return fmt.Errorf("unmount %s: %w", key, err)
	}
	if werr != nil {
		return fmt.Errorf("write into %s: %w", key, werr)
	}
	m.active[key] = s
	m.inFlight = crashOp{op: "commit", key: key, target: name, snap: s}
	if err := sn.Commit(ctx, name, key); err != nil {
		return err
	}
	delete(m.active, key)
	m.committed[name] = s
	return nil
}

// crashRemove removes a random committed leaf.
func crashRemove(ctx context.Context, sn snapshots.Snapshotter, m *crashModel, rng *rand.Rand) error {
	ls := leaves(*m)
	if len(ls) == 0 {
		return nil
	}
	name := ls[rng.IntN(len(ls))]
	m.inFlight = crashOp{op: "remove", key: name}
	if err := sn.Remove(ctx, name); err != nil {
		return err
	}
	delete(m.committed, name)
	return nil
}

func sortedKeys(m map[string]crashSnap) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// verifyCrashModel checks the restarted daemon against m, resolves the call
// that was in flight from what the daemon shows, and returns how many
// files it read back.
func verifyCrashModel(ctx context.Context, sn snapshots.Snapshotter, m *crashModel, mnt string) (int, error) {
	seen := map[string]snapshots.Info{}
	if err := sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error { seen[i.Name] = i; return nil }); err != nil {
		return 0, fmt.Errorf("walk after restart: %w", err)
	}
	// Resolve the call in flight: whatever it left must be whole.
	f := m.inFlight
	switch f.op {
	case "prepare":
		if _, ok := seen[f.key]; ok {
			// Prepare happened (or was finished by reconciliation): the key
			// is an active snapshot of its parent, with the parent's files.
			m.active[f.key] = crashSnap{parent: f.snap.parent, files: m.committed[f.snap.parent].files}
		} else {
			delete(m.active, f.key)
		}
	case "commit":
		_, hasKey := seen[f.key]
		_, hasName := seen[f.target]
		switch {
		case hasName && !hasKey:
			delete(m.active, f.key)
			m.committed[f.target] = f.snap
		case hasKey && !hasName:
			// Not committed: still the active snapshot, files included.
		default:
			return 0, fmt.Errorf("commit of %s to %s in flight: after restart key present=%v, name present=%v (want exactly one)", f.key, f.target, hasKey, hasName)
		}
	case "remove":
		if _, ok := seen[f.key]; !ok {
			delete(m.committed, f.key)
		}
	}

	var problems []string
	for name, i := range seen {
		_, isCommitted := m.committed[name]
		_, isActive := m.active[name]
		switch {
		case isCommitted && i.Kind != snapshots.KindCommitted:
			problems = append(problems, fmt.Sprintf("%s: committed, now kind %v", name, i.Kind))
		case isActive && i.Kind != snapshots.KindActive:
			problems = append(problems, fmt.Sprintf("%s: active, now kind %v", name, i.Kind))
		case !isCommitted && !isActive:
			problems = append(problems, fmt.Sprintf("%s: visible (kind %v, parent %q) but never reported made, or reported removed", name, i.Kind, i.Parent))
		}
	}
	for name, s := range m.committed {
		if i, ok := seen[name]; !ok {
			problems = append(problems, fmt.Sprintf("%s: Commit returned nil but it is gone", name))
		} else if i.Parent != s.parent {
			problems = append(problems, fmt.Sprintf("%s: parent %q, want %q", name, i.Parent, s.parent))
		}
	}
	for key, s := range m.active {
		if i, ok := seen[key]; !ok {
			problems = append(problems, fmt.Sprintf("%s: Prepare returned nil but it is gone", key))
		} else if i.Parent != s.parent {
			problems = append(problems, fmt.Sprintf("%s: parent %q, want %q", key, i.Parent, s.parent))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return 0, errors.New("after restart: " + strings.Join(problems, "; "))
	}

	// Content: every committed snapshot through a view, every active one
	// through its own mounts.
	read := 0
	for _, name := range sortedKeys(m.committed) {
		view := "verify-" + name
		mounts, err := sn.View(ctx, view, name)
		if err != nil {
			return read, fmt.Errorf("view of committed %s: %w", name, err)
		}
		n, cerr := checkFiles(mounts, mnt, m.committed[name].files)
		if err := sn.Remove(ctx, view); err != nil && !errdefs.IsNotFound(err) {
			return read, fmt.Errorf("remove view %s: %w", view, err)
		}
		if cerr != nil {
			return read, fmt.Errorf("committed %s: %w", name, cerr)
		}
		read += n
	}
	for _, key := range sortedKeys(m.active) {
		mounts, err := sn.Mounts(ctx, key)
		if err != nil {
			return read, fmt.Errorf("mounts of active %s: %w", key, err)
		}
		n, err := checkFiles(mounts, mnt, m.active[key].files)
		if err != nil {
			return read, fmt.Errorf("active %s: %w", key, err)
		}
		read += n
	}
	return read, nil
}

// checkFiles mounts mounts read-only and checks that each file has its
// content; it returns the number of files read.
func checkFiles(mounts []mount.Mount, mnt string, files map[string]string) (int, error) {
	ro := make([]mount.Mount, len(mounts))
	for i, m := range mounts {
		m.Options = append(append([]string(nil), m.Options...), "ro")
		ro[i] = m
	}
	if err := mount.All(ro, mnt); err != nil {
		return 0, fmt.Errorf("mount %+v: %w", ro, err)
	}
	defer mount.UnmountAll(mnt, 0)
	for p, want := range files {
		got, err := os.ReadFile(filepath.Join(mnt, p))
		if err != nil {
			return 0, fmt.Errorf("file %s: %w", p, err)
		}
		if string(got) != want {
			return 0, fmt.Errorf("file %s is %q, want %q", p, got, want)
		}
	}
	return len(files), nil
}
