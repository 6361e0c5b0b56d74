//go:build dm

package clients

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/integration/stack"
)

// registry is distribution's registry serving on 127.0.0.1 from a folder.
type registry struct {
	host string // 127.0.0.1:PORT, the registry part of image references
	proc *stack.Proc
}

// startRegistry writes the registry's config (filesystem storage under dir,
// deletes allowed, listening on a free loopback port, a drain timeout so
// that SIGTERM stops it cleanly) and starts bin with
// it; it returns once GET /v2/ answers 200, the API version check every
// client makes first.
func startRegistry(ctx context.Context, bin, dir string) (*registry, error) {
	if err := os.MkdirAll(filepath.Join(dir, "storage"), 0o755); err != nil {
		return nil, fmt.Errorf("registry folder: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("free port for the registry: %w", err)
	}
	host := l.Addr().String()
	l.Close()
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
  draintimeout: 2s
`, filepath.Join(dir, "storage"), host)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("registry config: %w", err)
	}
	p, err := stack.StartProc("registry", filepath.Join(dir, "registry.log"), []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		bin, "serve", cfgPath)
	if err != nil {
		return nil, err
	}
	r := &registry{host: host, proc: p}
	if err := stack.WaitDial(ctx, p, "tcp", host); err != nil {
		p.Kill()
		return nil, err
	}
	resp, err := r.do(ctx, http.MethodGet, "/v2/", "", nil)
	if err != nil {
		p.Kill()
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		p.Kill()
		return nil, fmt.Errorf("registry at %s: GET /v2/ answered %s; log %s:\n%s", host, resp.Status, p.LogPath, p.LogTail(20))
	}
	return r, nil
}

func (r *registry) stop() error { return r.proc.Stop(10 * time.Second) }

// do sends one request to the registry; path is either absolute ("/v2/...")
// or a Location the registry returned.
func (r *registry) do(ctx context.Context, method, path, contentType string, body []byte) (*http.Response, error) {
	u, err := url.Parse("http://" + r.host)
	if err != nil {
		return nil, err
	}
	if u, err = u.Parse(path); err != nil {
		return nil, fmt.Errorf("registry URL %q: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.ContentLength = int64(len(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("registry %s %s: %w", method, u, err)
	}
	return resp, nil
}

// readOCIArchive returns the files of an OCI archive by path and its index,
// which must name one manifest (as ociimage.Write makes it).
func readOCIArchive(archive []byte) (map[string][]byte, ocispec.Index, error) {
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

// push uploads the image in an OCI archive (as ociimage.Write makes it:
// one manifest in index.json) to repo:tag with the distribution API's
// monolithic blob upload (POST, then PUT ?digest=) and a manifest PUT, and
// returns the manifest's digest.
func (r *registry) push(ctx context.Context, archive []byte, repo, tag string) (digest.Digest, error) {
	files, index, err := readOCIArchive(archive)
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
		resp, err := r.do(ctx, http.MethodPost, "/v2/"+repo+"/blobs/uploads/", "", nil)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusAccepted || loc == "" {
			return "", fmt.Errorf("start upload of %s to %s/%s: %s (Location %q)", d.Digest, r.host, repo, resp.Status, loc)
		}
		sep := "?"
		if strings.Contains(loc, "?") {
			sep = "&"
		}
		resp, err = r.do(ctx, http.MethodPut, loc+sep+"digest="+url.QueryEscape(d.Digest.String()), "application/octet-stream", b)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return "", fmt.Errorf("upload %s (%d bytes) to %s/%s: %s", d.Digest, len(b), r.host, repo, resp.Status)
		}
	}
	resp, err := r.do(ctx, http.MethodPut, "/v2/"+repo+"/manifests/"+tag, md.MediaType, manifestJSON)
	if err != nil {
		return "", err
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("put manifest %s:%s to %s: %s: %s", repo, tag, r.host, resp.Status, bytes.TrimSpace(msg))
	}
	return md.Digest, nil
}
