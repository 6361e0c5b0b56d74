package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/pipeline"
)

// PipelineStatser is what AddPipeline reads: pipeline.Records.
type PipelineStatser interface {
	Stats(ctx context.Context) (pipeline.Stats, error)
}

// AddPipeline exports what the S3 pipelines hold, read from the database
// on each scrape: flyio_snapshotter_pipeline_runs{fsm,state},
// _pipeline_images{download_status}, _pipeline_blobs and
// _pipeline_blob_bytes (downloaded tarballs kept), _pipeline_unpacked and
// _pipeline_unpacked_bytes (unpacked layer devices) and
// _pipeline_activations (active snapshots of pulled images).
func (m *Metrics) AddPipeline(src PipelineStatser) {
	m.register(&pipelineCollector{src: src})
}

var (
	runsDesc = prometheus.NewDesc(Namespace+"_pipeline_runs",
		"State-machine runs recorded, by machine (download-image, unpack-image, activate-image) and state (pending, running, complete, aborted, failed).",
		[]string{"fsm", "state"}, nil)
	imagesDesc = prometheus.NewDesc(Namespace+"_pipeline_images",
		"Downloaded S3 objects by download status (pending, downloading, completed, failed).", []string{"download_status"}, nil)
	blobsDesc         = prometheus.NewDesc(Namespace+"_pipeline_blobs", "Downloaded layer tarballs kept on disk.", nil, nil)
	blobBytesDesc     = prometheus.NewDesc(Namespace+"_pipeline_blob_bytes", "Bytes of the downloaded layer tarballs kept on disk.", nil, nil)
	unpackedDesc      = prometheus.NewDesc(Namespace+"_pipeline_unpacked", "Unpacked layer devices of pulled images.", nil, nil)
	unpackedBytesDesc = prometheus.NewDesc(Namespace+"_pipeline_unpacked_bytes", "Bytes written into unpacked layer devices.", nil, nil)
	activationsDesc   = prometheus.NewDesc(Namespace+"_pipeline_activations", "Active snapshots of pulled images.", nil, nil)
)

type pipelineCollector struct{ src PipelineStatser }

func (c *pipelineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{runsDesc, imagesDesc, blobsDesc, blobBytesDesc, unpackedDesc, unpackedBytesDesc, activationsDesc} {
		ch <- d
	}
}

func (c *pipelineCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	st, err := c.src.Stats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(runsDesc, err)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, r := range st.Runs {
		gauge(runsDesc, float64(r.Runs), r.FSM, r.State)
	}
	for status, n := range st.Images {
		gauge(imagesDesc, float64(n), status)
	}
	gauge(blobsDesc, float64(st.Blobs))
	gauge(blobBytesDesc, float64(st.BlobBytes))
	gauge(unpackedDesc, float64(st.Unpacked))
	gauge(unpackedBytesDesc, float64(st.UnpackedBytes))
	gauge(activationsDesc, float64(st.Activations))
}

// SpoolSizer is what AddSpools reads: *pipeline.Pipelines.
type SpoolSizer interface {
	SpoolBytes() int64
}

// AddSpools exports flyio_snapshotter_pipeline_spool_bytes: the bytes of
// decompressed layers the pulls under way keep in the download folder
// (pipeline.spool_size bounds it), read on each scrape.
func (m *Metrics) AddSpools(s SpoolSizer) {
	m.register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace,
		Name:      "pipeline_spool_bytes",
		Help:      "Bytes of decompressed tar streams kept in the download folder for the layers that wait for the layer below them to be unpacked; at most pipeline.spool_size.",
	}, func() float64 { return float64(s.SpoolBytes()) }))
}
