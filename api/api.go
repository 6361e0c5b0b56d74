// Package api holds the types the daemon's operator API is made of: what a
// pull asks for and answers, the progress events a pull streams, an
// activation, and what a removal removed. The pipelines and the garbage
// collector produce them, the control socket carries them as JSON, and the
// command-line clients print them.
//
// It is a leaf: it imports the standard library and containerd's small
// identifier rules, nothing of the daemon. A client that links only this
// package and the control socket's client starts without the package
// initialisers of the AWS SDK, containerd's client, gRPC and protobuf,
// which is most of a full binary's start-up.
package api

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/pkg/identifiers"
)

// Names of the durable state machines a pull runs; an Event's FSM is one
// of them.
const (
	FSMDownload = "download-image"
	FSMUnpack   = "unpack-image"
	FSMActivate = "activate-image"
)

// PullRequest names an S3 image: one layer key (".tar", ".tar.gz",
// ".tar.zst"), or a prefix whose layer objects are its layers.
type PullRequest struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	// Ref names the image (the containerd image name, which the daemon
	// checks); empty means the default name of the bucket and key.
	Ref string `json:"ref,omitempty"`
	// Replace lets Ref move from another pulled image, and repoint an
	// image containerd has under that name that this daemon did not
	// create (its labels kept); without it either is refused, naming who
	// has the name.
	Replace bool `json:"replace,omitempty"`
	// Refresh runs the pipelines even when the image is pulled and
	// unchanged, so that every layer's device is checked in the pool.
	Refresh bool `json:"refresh,omitempty"`
	// Cached answers from the records alone, without asking S3 what the
	// image is now; it fails when the image is not pulled and in place.
	Cached bool `json:"cached,omitempty"`
	// Namespaces are the containerd namespaces to register the image in
	// (each a containerd namespace name, e.g. "k8s.io" for the CRI); none
	// means the registrar's own ([containerd] namespace).
	Namespaces []string `json:"namespaces,omitempty"`
}

// CheckNamespaces refuses a containerd namespace containerd would refuse,
// naming it and the rule, and returns nss without repeats.
func CheckNamespaces(nss []string) ([]string, error) {
	var out []string
	for _, ns := range nss {
		if err := identifiers.Validate(ns); err != nil {
			return nil, fmt.Errorf("containerd namespace %q: must be letters, digits and ._- separators, at most 76 characters: %w", ns, err)
		}
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out, nil
}

// ParseS3URL splits s3://BUCKET/KEY-or-PREFIX.
func ParseS3URL(u string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(u, "s3://")
	if !ok {
		return "", "", fmt.Errorf("image %q: must be s3://BUCKET/KEY-or-PREFIX", u)
	}
	bucket, key, _ = strings.Cut(rest, "/")
	if bucket == "" || key == "" {
		return "", "", fmt.Errorf("image %q: must name a bucket and a key or prefix (s3://BUCKET/KEY-or-PREFIX)", u)
	}
	return bucket, key, nil
}

// PullResult describes a pulled, unpacked and activated image.
type PullResult struct {
	Ref        string           `json:"ref"`
	Source     string           `json:"source"`
	ImageID    string           `json:"image_id"`
	Layers     []Layer          `json:"layers"`
	TopChainID string           `json:"top_chain_id"`
	Snapshot   ActivateResponse `json:"snapshot"`
	// Downloaded counts the layers whose download run fetched bytes from S3
	// and Unpacked the chain positions whose unpack run extracted them; a
	// run shared with a concurrent pull of the same image counts in both.
	Downloaded int `json:"downloaded"`
	Unpacked   int `json:"unpacked"`
}

// Layer is one layer of a pulled image: the object it was listed as and,
// once downloaded, its diff ID and chain ID.
type Layer struct {
	Key     string `json:"key"`
	Size    int64  `json:"size"`
	ETag    string `json:"etag,omitempty"`
	DiffID  string `json:"diff_id,omitempty"`
	ChainID string `json:"chain_id,omitempty"`
}

// ActivateResponse is an image's activation: its active snapshot, the
// snapshot's device and where the image is registered.
type ActivateResponse struct {
	ImageID      string `json:"image_id"`
	SnapshotName string `json:"snapshot_name"` // the activation's key
	DeviceName   string `json:"device_name"`
	DevicePath   string `json:"device_path"`
	OriginDevice uint32 `json:"origin_device_id"` // the top chain's thin id
	Active       bool   `json:"active"`
	Activated    bool   `json:"activated"` // false when it already was
	Registered   bool   `json:"registered"`
	// RegisterPending is true when containerd's socket was absent at
	// registration: the daemon registers Ref once containerd answers.
	RegisterPending bool   `json:"register_pending,omitempty"`
	Ref             string `json:"ref,omitempty"` // the name register registered
	// Namespaces are the containerd namespaces register registered Ref in
	// (none: the registrar's own).
	Namespaces []string `json:"namespaces,omitempty"`
}

// Event is the progress of a pull: which state a layer's machine is in and
// how far its download or extraction got.
type Event struct {
	// Run is the state-machine run the event comes from; the daemon uses
	// it to route the event to the pulls watching that run, and does not
	// send it.
	Run   string `json:"-"`
	FSM   string `json:"fsm"`
	State string `json:"state"`           // the transition under way
	Layer int    `json:"layer,omitempty"` // 1-based layer of the pull (set by the pull)
	Bytes int64  `json:"bytes"`           // bytes downloaded or extracted so far
	Total int64  `json:"total,omitempty"` // what Bytes counts towards, when known: the layer tarball's size while downloading
	Files int    `json:"files"`           // files extracted so far
}

// Sources of the images garbage collection and rm remove: a Removed's
// Kind, the label of the removal metric and the kind in the logs.
const (
	SourceS3       = "s3"       // pulled by the pipelines from S3
	SourceRegistry = "registry" // unpacked into the pool by containerd itself
)

// Removed describes one removed image.
type Removed struct {
	// Kind is SourceS3 or SourceRegistry.
	Kind string
	// ImageID and Source are an S3 image's id and S3 source.
	ImageID string
	Source  string
	// Namespace is the containerd namespace of a registry image.
	Namespace string
	Names     []string
	Reason    string
	// Freed is the pool data the removal freed, in bytes.
	Freed int64
}
