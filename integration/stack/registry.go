package stack

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Registry is distribution's registry serving on 127.0.0.1 from a folder,
// over plain HTTP.
type Registry struct {
	Host string // 127.0.0.1:PORT, the registry part of image references
	Proc *Proc
}

// StartRegistry writes the registry's config (filesystem storage under
// dir, deletes allowed, a free loopback port, a drain timeout so that
// SIGTERM stops it cleanly), starts bin (integration/tools' registry) with
// it and returns once GET /v2/, the API check every client makes first,
// answers 200.
func StartRegistry(ctx context.Context, bin, dir string) (*Registry, error) {
	if err := LoopbackUp(ctx); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		return nil, fmt.Errorf("registry folder: %w", err)
	}
	cfgPath := filepath.Join(dir, "config.yml")
	p, host, err := ServeOnFreePort(ctx, func(host string) (*Proc, error) {
		cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n  draintimeout: 2s\n",
			filepath.Join(dir, "storage"), host)
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			return nil, fmt.Errorf("registry config: %w", err)
		}
		return StartServing(ctx, "registry", filepath.Join(dir, "registry.log"), []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, "tcp", host, bin, "serve", cfgPath)
	})
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: host, Proc: p}
	resp, err := r.do(ctx, http.MethodGet, "/v2/", "", nil, 0)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("registry at %s: GET /v2/ answered %s; log %s:\n%s", host, resp.Status, p.LogPath, p.LogTail(20))
		}
	}
	if err != nil {
		p.Kill()
		return nil, err
	}
	return r, nil
}

// Stop ends the registry with SIGTERM.
func (r *Registry) Stop() error { return r.Proc.Stop(10 * time.Second) }

// do sends one request; path is absolute ("/v2/...") or a Location the
// registry returned. body may be nil (size 0).
func (r *Registry) do(ctx context.Context, method, path, contentType string, body io.Reader, size int64) (*http.Response, error) {
	base, _ := url.Parse("http://" + r.Host)
	u, err := base.Parse(path)
	if err != nil {
		return nil, fmt.Errorf("registry URL %q: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.ContentLength = size
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("registry %s %s: %w", method, u, err)
	}
	return resp, nil
}

// PushBlob uploads the file at path, whose digest is dgst ("sha256:..."),
// to repo with the distribution API's monolithic upload (POST, then PUT
// ?digest=), streaming it from the file.
func (r *Registry) PushBlob(ctx context.Context, repo, dgst, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("push blob %s: %w", dgst, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("push blob %s: %w", dgst, err)
	}
	return r.pushBlob(ctx, repo, dgst, path, f, st.Size())
}

// pushBlob uploads size bytes from body, whose digest is dgst, to repo
// (POST, then PUT ?digest=); what names the blob's source in errors.
func (r *Registry) pushBlob(ctx context.Context, repo, dgst, what string, body io.Reader, size int64) error {
	resp, err := r.do(ctx, http.MethodPost, "/v2/"+repo+"/blobs/uploads/", "", nil, 0)
	if err != nil {
		return err
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusAccepted || loc == "" {
		return fmt.Errorf("start upload of %s to %s/%s: %s (Location %q)", dgst, r.Host, repo, resp.Status, loc)
	}
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	resp, err = r.do(ctx, http.MethodPut, loc+sep+"digest="+url.QueryEscape(dgst), "application/octet-stream", body, size)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("upload %s (%s, %d bytes) to %s/%s: %s", dgst, what, size, r.Host, repo, resp.Status)
	}
	return nil
}

// PushManifest puts a manifest (its blobs pushed before) as repo:tag.
func (r *Registry) PushManifest(ctx context.Context, repo, tag, mediaType string, manifest []byte) error {
	resp, err := r.do(ctx, http.MethodPut, "/v2/"+repo+"/manifests/"+tag, mediaType, strings.NewReader(string(manifest)), int64(len(manifest)))
	if err != nil {
		return err
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("put manifest %s:%s to %s: %s: %s", repo, tag, r.Host, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// ReadOCIArchive returns the files of an OCI archive (a tar) by path and
// its index, which must name one manifest (as ociimage.Write makes it).
func ReadOCIArchive(archive []byte) (map[string][]byte, ocispec.Index, error) {
	files := map[string][]byte{}
	var index ocispec.Index
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, index, fmt.Errorf("read OCI archive: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, index, fmt.Errorf("read OCI archive entry %s: %w", h.Name, err)
			}
			files[h.Name] = b
		}
	}
	if err := json.Unmarshal(files[ocispec.ImageIndexFile], &index); err != nil || len(index.Manifests) != 1 {
		return nil, index, fmt.Errorf("OCI archive: index.json with one manifest wanted (%d, %v)", len(index.Manifests), err)
	}
	return files, index, nil
}

// PushOCIArchive uploads the image in an OCI archive (one manifest in its
// index.json) to repo:tag, its config and layers with PushBlob's
// monolithic upload and then its manifest, and returns the manifest's
// digest.
func (r *Registry) PushOCIArchive(ctx context.Context, archive []byte, repo, tag string) (digest.Digest, error) {
	files, index, err := ReadOCIArchive(archive)
	if err != nil {
		return "", err
	}
	md := index.Manifests[0]
	blob := func(d digest.Digest) ([]byte, error) {
		b, ok := files["blobs/"+d.Algorithm().String()+"/"+d.Encoded()]
		if !ok {
			return nil, fmt.Errorf("OCI archive has no blob %s", d)
		}
		return b, nil
	}
	manifestJSON, err := blob(md.Digest)
	if err != nil {
		return "", err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(manifestJSON, &m); err != nil {
		return "", fmt.Errorf("OCI archive manifest %s: %w", md.Digest, err)
	}
	for _, d := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		b, err := blob(d.Digest)
		if err != nil {
			return "", err
		}
		if err := r.pushBlob(ctx, repo, d.Digest.String(), "OCI archive", bytes.NewReader(b), int64(len(b))); err != nil {
			return "", err
		}
	}
	if err := r.PushManifest(ctx, repo, tag, md.MediaType, manifestJSON); err != nil {
		return "", err
	}
	return md.Digest, nil
}
