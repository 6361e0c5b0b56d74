package pipeline

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest"
	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/metadata/metadatatest/seed"
)

// TestRetention: finished runs older than the age or beyond the count go,
// oldest first, in batches; live runs, and finished runs a live run waits
// for or descends from, stay; an image whose pulls all failed goes once old
// enough, an image that was pulled stays whatever its last failure.
func TestRetention(t *testing.T) {
	ctx := context.Background()
	db := metadatatest.Open(t)
	now := time.Unix(1_900_000_000, 0)
	day := 24 * time.Hour
	run := func(id, state string, finishedAgo time.Duration, parent string, after ...string) {
		t.Helper()
		live := state
		if state != "pending" {
			live = "running"
		}
		r := seed.Run{ID: id, FSM: "m", IdempotencyID: id, Parent: parent, RunAfter: after, State: live, Created: now.Add(-finishedAgo - time.Minute)}
		if err := seed.InsertRun(ctx, db, r); err != nil {
			t.Fatalf("insert run %s: %v", id, err)
		}
		if state != live {
			if err := seed.FinishRun(ctx, db, id, state, now.Add(-finishedAgo)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Seven old finished runs, two of them still needed by live runs.
	for i := range 7 {
		run(fmt.Sprintf("old-%d", i), []string{"complete", "failed", "aborted"}[i%3], 10*day+time.Duration(i)*time.Hour, "")
	}
	run("old-parent", "complete", 20*day, "")
	run("live-child", "running", 0, "old-parent")
	run("old-before", "complete", 20*day, "")
	run("live-waiter", "pending", 0, "", "x", "old-before")
	// Recent finished runs, newest last.
	for i := range 5 {
		run(fmt.Sprintf("new-%d", i), "complete", time.Duration(5-i)*time.Hour, "")
	}

	if err := seed.MarkImageFailed(ctx, db, "s3-failed", "s3://b/failed.tar", "no such key"); err != nil {
		t.Fatal(err)
	}
	if err := seed.WriteImage(ctx, db, 1); err != nil {
		t.Fatal(err)
	}
	if err := seed.MarkImageFailed(ctx, db, "s3-w1", "s3://bkt/w/1.tar", "a later pull failed"); err != nil {
		t.Fatal(err)
	}

	// Nothing is old yet for the images; runs: the count keeps the 3 newest.
	res, err := RecordsOf(db).retain(ctx, Retention{RunsMaxAge: 7 * day, RunsMaxCount: 3, FailedImagesMaxAge: -1}, now, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := queryAll(ctx, db.Statements(), "list run ids", func(s rowScanner) (id string, err error) {
		return id, s.Scan(&id)
	}, `SELECT run_id FROM fsm_runs ORDER BY run_id`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"live-child", "live-waiter", "new-2", "new-3", "new-4", "old-before", "old-parent"}
	if !slices.Equal(ids, want) {
		t.Errorf("runs kept %v, want %v", ids, want)
	}
	if res.Runs != 9 || res.FailedImages != 0 {
		t.Errorf("retention = %+v, want 9 runs and no image", res)
	}

	// An image is judged by when it was created or last used: a year on,
	// the image that never pulled goes, the pulled one stays.
	res, err = RecordsOf(db).retain(ctx, Retention{RunsMaxAge: -1, RunsMaxCount: -1}, now.Add(365*day), 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.FailedImages != 1 || res.Runs != 0 {
		t.Errorf("retention a year on = %+v, want the one failed image", res)
	}
	if im := seed.Rows(t, db.Statements(), `SELECT image_id FROM s3_images WHERE image_id = 's3-failed'`); len(im) != 0 {
		t.Errorf("failed image kept: %q", im)
	}
	if im := seed.Rows(t, db.Statements(), `SELECT image_id FROM s3_images WHERE image_id = 's3-w1'`); len(im) != 1 {
		t.Error("the pulled image whose later pull failed was deleted")
	}
}

// TestRetentionKeepsFailedImageTriedRecently: an image whose pulls all
// failed is kept failed_images_max_age after it was last tried, not after
// its first try.
func TestRetentionKeepsFailedImageTriedRecently(t *testing.T) {
	ctx := context.Background()
	db := metadatatest.Open(t)
	day := 24 * time.Hour
	// First tried ten days ago.
	if err := seed.MarkImageFailed(ctx, db, "s3-f", "s3://b/f.tar", "no such key"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Statements().ExecContext(ctx, `UPDATE s3_images SET created_ns = ? WHERE image_id = 's3-f'`,
		time.Now().Add(-10*day).UnixNano()); err != nil {
		t.Fatal(err)
	}
	// Tried again now, and failed again.
	if err := RecordsOf(db).MarkImageFailed(ctx, "s3-f", "s3://b/f.tar", "still no such key"); err != nil {
		t.Fatal(err)
	}
	res, err := RecordsOf(db).Retain(ctx, Retention{RunsMaxAge: -1, RunsMaxCount: -1, FailedImagesMaxAge: 7 * day}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if im := seed.Rows(t, db.Statements(), `SELECT image_id FROM s3_images WHERE image_id = 's3-f'`); len(im) != 1 || res.FailedImages != 0 {
		t.Errorf("retention %+v deleted the failed image tried a moment ago (first tried ten days ago, kept 7 days after its last try)", res)
	}
}

// TestTouchImageNeverMovesLastUseBack: after the wall clock jumped back
// (an NTP step, a wrong RTC corrected), a use of an image must not make it
// look used earlier than it already was: garbage collection would take
// the image just used for one of the least recently used.
func TestTouchImageNeverMovesLastUseBack(t *testing.T) {
	ctx := context.Background()
	db := metadatatest.Open(t)
	if err := seed.WriteImage(ctx, db, 1); err != nil {
		t.Fatal(err)
	}
	// Last used an hour ahead of the clock now: recorded before it
	// jumped back.
	ahead := time.Now().Add(time.Hour).UnixNano()
	if _, err := db.Statements().ExecContext(ctx, `UPDATE s3_images SET used_ns = ?`, ahead); err != nil {
		t.Fatal(err)
	}
	id := seed.Rows(t, db.Statements(), `SELECT image_id FROM s3_images`)[0]
	if err := RecordsOf(db).TouchImage(ctx, id); err != nil {
		t.Fatal(err)
	}
	var used int64
	if err := db.Statements().QueryRowContext(ctx, `SELECT used_ns FROM s3_images WHERE image_id = ?`, id).Scan(&used); err != nil {
		t.Fatal(err)
	}
	if used < ahead {
		t.Errorf("a use moved the image's last use back by %s", time.Duration(ahead-used))
	}
}

// TestRetentionKeepsTheRunsAPullNames: a pull names the download run of a
// layer, and the unpack run of the layer below, as the run-after
// predecessors of the layer's unpack run only once they have ended, and
// the unpack run reads the download's response from its predecessor. A
// retention pass in between (here: the count keeps one finished run,
// newer than the pull's) must not forget those runs: the unpack run
// would not start, or would end aborted for a predecessor that does not
// exist, and the pull fail.
func TestRetentionKeepsTheRunsAPullNames(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "a/1.tar", layerTar(t, "base", 3000))
	e.srv.Put(t, "a/2.tar", layerTar(t, "app", 3000))
	ctx := context.Background()
	finishRunNewerThanNow(t, e)
	passes := 0
	e.p.hooks = map[string]func(){"download:awaited": func() {
		passes++
		if _, err := e.p.Retain(ctx, Retention{RunsMaxAge: -1, RunsMaxCount: 1, FailedImagesMaxAge: -1}, time.Now()); err != nil {
			t.Errorf("retention pass: %v", err)
		}
	}}
	if _, err := e.pull("a/", "a"); err != nil {
		t.Fatalf("pull with a retention pass after each download was awaited: %v", err)
	}
	if passes != 2 {
		t.Fatalf("%d retention passes ran, want one per layer", passes)
	}
	// Once the pull has ended, its runs are history like any other.
	res, err := e.p.Retain(ctx, Retention{RunsMaxAge: -1, RunsMaxCount: 1, FailedImagesMaxAge: -1}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs != 5 {
		t.Errorf("retention after the pull forgot %d runs, want the pull's 5 (2 downloads, 2 unpacks, 1 activate)", res.Runs)
	}
}

// finishRunNewerThanNow records a finished run an hour newer than now, the
// one a retention keeping a single finished run keeps.
func finishRunNewerThanNow(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	newer := time.Now().Add(time.Hour)
	if err := seed.InsertRun(ctx, e.db, seed.Run{ID: "newer", FSM: "m", IdempotencyID: "newer", State: "running", Created: newer}); err != nil {
		t.Fatal(err)
	}
	if err := seed.FinishRun(ctx, e.db, "newer", "complete", newer); err != nil {
		t.Fatal(err)
	}
}

// TestRetentionKeepsTheActivateRunAPullAwaits: a pull, and an activate,
// read the activate run's response once it has ended, when no live run
// refers to it. A retention pass that comes between the run's end and
// that read (here: the count keeps one finished run, newer than the
// activate run) must not forget the run: the image is activated and
// registered, and the call must say so, not fail on a run not found.
func TestRetentionKeepsTheActivateRunAPullAwaits(t *testing.T) {
	e := newPullEnv(t, nil)
	e.srv.Put(t, "a/1.tar", layerTar(t, "base", 3000))
	ctx := context.Background()
	finishRunNewerThanNow(t, e)
	passes := 0
	e.p.hooks = map[string]func(){"activate:started": func() {
		passes++
		e.waitNoLiveRun("the activate run")
		if _, err := e.p.Retain(ctx, Retention{RunsMaxAge: -1, RunsMaxCount: 1, FailedImagesMaxAge: -1}, time.Now()); err != nil {
			t.Errorf("retention pass: %v", err)
		}
	}}
	if _, err := e.pull("a/", "a"); err != nil {
		t.Fatalf("pull with a retention pass once its activate run ended: %v", err)
	}
	if _, err := e.p.Activate(ctx, "a"); err != nil {
		t.Fatalf("activate with a retention pass once its activate run ended: %v", err)
	}
	if passes != 2 {
		t.Fatalf("%d retention passes ran, want one for the pull and one for the activate", passes)
	}
}
