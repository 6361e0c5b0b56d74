package snapshotter

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// An operator reviews what start-up quarantined: lists it, cannot release
// an id the pool still holds, deletes the device (and the device-mapper
// device mapping it), then releases the id; ids the records own, or that
// are not quarantined, are refused with the reason.
func TestQuarantineReview(t *testing.T) {
	ctx := context.Background()
	s, pool := newFakeSnapshotter(t, Config{})
	base := s.base.ID
	const stray = 777
	if err := pool.CreateThin(ctx, stray); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Activate(ctx, "someone-elses", stray, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := New(ctx, s.db, pool, Config{}); err != nil { // start-up
		t.Fatal(err)
	}
	qs, err := ListQuarantine(ctx, s.db, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 1 || qs[0].DeviceID != stray || !qs[0].InPool || !qs[0].PoolChecked || qs[0].Deleted || !strings.Contains(qs[0].Reason, "start-up") {
		t.Fatalf("quarantine after start-up = %+v, want thin id %d, in the pool, kept", qs, stray)
	}
	if qs, err := ListQuarantine(ctx, s.db, nil); err != nil || len(qs) != 1 || qs[0].PoolChecked {
		t.Fatalf("ListQuarantine without a pool = %+v, %v", qs, err)
	}

	if err := ReleaseQuarantined(ctx, s.db, pool, stray); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "delete it first") {
		t.Fatalf("release of an id still in the pool: %v, want FailedPrecondition saying to delete it first", err)
	}
	if err := DeleteQuarantined(ctx, s.db, pool, 12345); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "12345 is not quarantined") {
		t.Fatalf("delete of an id never quarantined: %v, want NotFound naming it", err)
	}
	// An id the records own (here the base) is the daemon's, even if
	// someone quarantined it.
	if err := s.db.WithTx(ctx, func(tx *sql.Tx) error {
		return RecordsTx(tx).Quarantine(ctx, base, "test", false, 1)
	}); err != nil {
		t.Fatal(err)
	}
	if err := DeleteQuarantined(ctx, s.db, pool, base); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "device record owns it") {
		t.Fatalf("delete of an id a record owns: %v, want FailedPrecondition", err)
	}
	if ok, _ := pool.ThinExists(ctx, base); !ok {
		t.Fatal("the base device was deleted")
	}

	if err := DeleteQuarantined(ctx, s.db, pool, stray); err != nil {
		t.Fatal(err)
	}
	if ok, _ := pool.ThinExists(ctx, stray); ok {
		t.Fatal("quarantined device still in the pool after delete")
	}
	if _, active := pool.Counts(); active != 0 {
		t.Fatalf("%d devices still mapped after delete", active)
	}
	qs, _ = ListQuarantine(ctx, s.db, pool)
	i := slices.IndexFunc(qs, func(q Quarantined) bool { return q.DeviceID == stray })
	if len(qs) != 2 || i < 0 || !qs[i].Deleted || qs[i].InPool {
		t.Fatalf("after delete = %+v, want %d recorded deleted and still quarantined", qs, stray)
	}
	if err := ReleaseQuarantined(ctx, s.db, pool, stray); err != nil {
		t.Fatal(err)
	}
	qs, _ = ListQuarantine(ctx, s.db, pool)
	if len(qs) != 1 || qs[0].DeviceID != base {
		t.Fatalf("after release = %+v, want only the base's test entry", qs)
	}
	if err := ReleaseQuarantined(ctx, s.db, pool, stray); !errdefs.IsNotFound(err) {
		t.Fatalf("second release: %v, want NotFound", err)
	}
}
