package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/thinpool"
)

// TestPoolEventsCount: low-water events and growths are counted with the
// bytes added; a "growth" that added nothing counts nothing.
func TestPoolEventsCount(t *testing.T) {
	m := New()
	e := NewPoolEvents("p1")
	m.AddPoolEvents(e)
	e.LowWater()
	e.LowWater()
	e.Grew(32<<20, 40<<20)
	e.Grew(40<<20, 40<<20)
	if got := counters(t, m, Namespace+"_pool_low_water_events_total"); got["pool=p1"] != 2 {
		t.Errorf("low-water events = %v", got)
	}
	if got := counters(t, m, Namespace+"_pool_growths_total"); got["pool=p1"] != 1 {
		t.Errorf("growths = %v", got)
	}
	if got := counters(t, m, Namespace+"_pool_grown_bytes_total"); got["pool=p1"] != 8<<20 {
		t.Errorf("grown bytes = %v", got)
	}
}

// fakePoolStatus stands in for the kernel's answer at the status boundary:
// a status line and a table's low-water mark the test chooses, and a
// reserve.
type fakePoolStatus struct {
	st          thinpool.PoolStatus
	reserve     float64
	lowWater    uint64
	lowWaterErr error
}

func (f *fakePoolStatus) Name() string { return "p1" }
func (f *fakePoolStatus) Status(context.Context) (thinpool.PoolStatus, error) {
	return f.st, nil
}
func (f *fakePoolStatus) Peek(context.Context) (thinpool.PoolStatus, error) {
	return f.st, nil
}
func (f *fakePoolStatus) MinFreePercent() float64 { return f.reserve }
func (f *fakePoolStatus) LowWaterBlocks(context.Context) (uint64, error) {
	return f.lowWater, f.lowWaterErr
}

// TestPoolReserveAndQueuedWrites: the reserve is exported in bytes, and
// whether the pool is under it, queueing writes or failing them follows
// its status.
func TestPoolReserveAndQueuedWrites(t *testing.T) {
	m := New()
	f := &fakePoolStatus{reserve: 10, st: thinpool.PoolStatus{UsedMetadataBlocks: 10, TotalMetadataBlocks: 1000,
		UsedDataBlocks: 100, TotalDataBlocks: 1000, BlockSizeSectors: 128, Mode: thinpool.ModeReadWrite, QueueIfNoSpace: true}}
	m.AddPool(f)
	gauges := func(name string) float64 {
		return samples(t, m, Namespace+name, func(mt *dto.Metric) float64 { return mt.GetGauge().GetValue() })["pool=p1"]
	}
	if d, md := gauges("_pool_reserve_data_bytes"), gauges("_pool_reserve_metadata_bytes"); d != 100*64<<10 || md != 100*4096 {
		t.Errorf("reserve: data %v, metadata %v bytes; want %v, %v", d, md, 100*64<<10, 100*4096)
	}
	for _, c := range []struct {
		used                   uint64
		mode                   thinpool.PoolMode
		queue                  bool
		under, queued, failing float64
	}{
		{100, thinpool.ModeReadWrite, true, 0, 0, 0},
		{950, thinpool.ModeReadWrite, true, 1, 0, 0},
		{1000, thinpool.ModeOutOfDataSpace, true, 1, 1, 0},
		{1000, thinpool.ModeOutOfDataSpace, false, 1, 0, 1},
	} {
		f.st.UsedDataBlocks, f.st.Mode, f.st.QueueIfNoSpace, f.st.ErrorIfNoSpace = c.used, c.mode, c.queue, !c.queue
		u, q, fl := gauges("_pool_under_reserve"), gauges("_pool_writes_queued"), gauges("_pool_writes_failing")
		if u != c.under || q != c.queued || fl != c.failing {
			t.Errorf("%d/1000 used, %s, queue %v: under reserve %v, queued %v, failing %v; want %v, %v, %v",
				c.used, c.mode, c.queue, u, q, fl, c.under, c.queued, c.failing)
		}
	}
}

// TestPoolUnderLowWater: the pool is reported under its low-water mark
// for as long as its free data blocks are at or under the table's mark,
// the kernel's comparison, not only when an event comes.
func TestPoolUnderLowWater(t *testing.T) {
	m := New()
	f := &fakePoolStatus{reserve: 10, lowWater: 100, st: thinpool.PoolStatus{TotalMetadataBlocks: 1000,
		TotalDataBlocks: 1000, BlockSizeSectors: 128, Mode: thinpool.ModeReadWrite}}
	m.AddPool(f)
	for _, c := range []struct {
		used  uint64
		under float64
	}{
		{0, 0},
		{899, 0}, // 101 free
		{900, 1}, // 100 free: at the mark
		{950, 1}, // and it stays 1 on every scrape while under it
		{950, 1},
		{1000, 1}, // out of data space
		{800, 0},  // data freed (or the pool grown)
	} {
		f.st.UsedDataBlocks = c.used
		got := gauges(t, m, Namespace+"_pool_under_low_water")
		if got["pool=p1"] != c.under || len(got) != 1 {
			t.Errorf("%d/1000 data blocks used, low-water mark 100: pool_under_low_water %v, want pool=p1 at %v", c.used, got, c.under)
		}
	}

	// A table that cannot be read fails the scrape rather than reporting
	// the pool above its mark.
	f.lowWaterErr = errors.New("DM_TABLE_STATUS: no such device")
	if _, err := m.Registry().Gather(); err == nil || !strings.Contains(err.Error(), "no such device") {
		t.Errorf("gather with an unreadable table: err %v, want the table's error", err)
	}
}

// failingPoolStatus is a pool whose status the kernel refuses.
type failingPoolStatus struct{ fakePoolStatus }

func (failingPoolStatus) Status(context.Context) (thinpool.PoolStatus, error) {
	return thinpool.PoolStatus{}, errors.New("dm status flyio-pool: no such device or address")
}
func (failingPoolStatus) Peek(context.Context) (thinpool.PoolStatus, error) {
	return thinpool.PoolStatus{}, errors.New("dm status flyio-pool: no such device or address")
}

// TestScrapeWithAFailingSource: when the pool's status cannot be read, a
// scrape still answers 200 with every other metric, leaves the pool's
// out, and the next scrape counts the failure.
func TestScrapeWithAFailingSource(t *testing.T) {
	m := New()
	e := NewPoolEvents("p1")
	m.AddPoolEvents(e)
	m.AddPool(&failingPoolStatus{})
	e.LowWater()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	scrape := func() string {
		t.Helper()
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("scrape with the pool's status failing: %s\n%s", resp.Status, body)
		}
		return string(body)
	}
	first := scrape()
	if !strings.Contains(first, Namespace+`_pool_low_water_events_total{pool="p1"} 1`) {
		t.Errorf("the other sources' metrics are not served:\n%s", first)
	}
	if strings.Contains(first, Namespace+"_pool_data_used_bytes{") {
		t.Errorf("a pool usage is served though its status failed:\n%s", first)
	}
	if second := scrape(); !strings.Contains(second, `promhttp_metric_handler_errors_total{cause="gathering"} 1`) {
		t.Errorf("the failed gathering is not counted:\n%s", second)
	}
}

// wedgedDevices is a fake DeviceCounter whose read answers only when its
// context ends: a database or a kernel call wedged past any scrape.
type wedgedDevices struct{}

func (wedgedDevices) DeviceCounts(ctx context.Context) (map[string]int, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// prometheusScrapeTimeout is Prometheus's default scrape_timeout: a
// scrape not answered by then is a failed one (up 0), whatever follows.
const prometheusScrapeTimeout = 10 * time.Second

// TestScrapeWithAWedgedSourceAnswersInTime: a source that never answers
// is given up on soon enough that the scrape, with every other metric,
// reaches a Prometheus that waits its default scrape_timeout. Answered
// later, the scrape is lost whole and the daemon reads as down
// (FlyioSnapshotterDown) instead of FlyioMetricsIncomplete naming the
// source.
func TestScrapeWithAWedgedSourceAnswersInTime(t *testing.T) {
	m := New()
	e := NewPoolEvents("p1")
	m.AddPoolEvents(e)
	m.AddDevices(wedgedDevices{})
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", strconv.Itoa(int(prometheusScrapeTimeout/time.Second)))
	start := time.Now()
	resp, err := (&http.Client{Timeout: prometheusScrapeTimeout}).Do(req)
	if err != nil {
		t.Fatalf("scrape with a wedged source not answered within Prometheus's default scrape_timeout (%s): %v", prometheusScrapeTimeout, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), Namespace+`_pool_low_water_events_total{pool="p1"} 0`) {
		t.Fatalf("scrape with a wedged source after %s: %s, without the other sources' metrics:\n%s", time.Since(start), resp.Status, body)
	}
}

// stalledCommitPool is a fake pool whose metadata device has stalled: a
// status that first commits the metadata (Status) waits for writes that
// do not finish, and, like the ioctl, does not give up with its context;
// the status the kernel holds in memory (Peek) answers.
type stalledCommitPool struct {
	fakePoolStatus
	stalled chan struct{}
}

func (p *stalledCommitPool) Status(context.Context) (thinpool.PoolStatus, error) {
	<-p.stalled
	return p.st, nil
}

// TestScrapeDoesNotCommitThePoolsMetadata: a scrape reads the pool's
// usage as the kernel holds it, without making the pool commit its
// metadata first, so a metadata device that stalls (a failing disk, a
// saturated one) leaves the pool's metrics, and the scrape, answering.
func TestScrapeDoesNotCommitThePoolsMetadata(t *testing.T) {
	p := &stalledCommitPool{fakePoolStatus: fakePoolStatus{st: thinpool.PoolStatus{TotalDataBlocks: 100, UsedDataBlocks: 50,
		TotalMetadataBlocks: 100, BlockSizeSectors: 128, Mode: thinpool.ModeReadWrite}}, stalled: make(chan struct{})}
	m := New()
	m.AddPool(p)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	// Before the server's Close, which waits for the scrape under way.
	defer close(p.stalled)
	resp, err := (&http.Client{Timeout: prometheusScrapeTimeout}).Get(srv.URL)
	if err != nil {
		t.Fatalf("scrape with the pool's metadata device stalled not answered within Prometheus's default scrape_timeout (%s): %v", prometheusScrapeTimeout, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := Namespace + `_pool_data_used_bytes{pool="p1"} 3.2768e+06`; !strings.Contains(string(body), want) {
		t.Errorf("scrape with the pool's metadata device stalled lacks %s:\n%s", want, body)
	}
}
