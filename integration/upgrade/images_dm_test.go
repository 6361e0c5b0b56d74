//go:build dm

package upgrade

import (
	"archive/tar"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"time"
)

const (
	// s3Bucket is the bucket versitygw serves the test's images from.
	s3Bucket = "flyio-upgrade"
	// namePath is a file of every image's top layer holding the image's
	// short name: a container shows which image it runs on.
	namePath = "/etc/upgrade-image"
	// payloadPath holds the big images' payload.
	payloadPath = "/opt/payload.bin"
	// busyboxPath is the host's static busybox, the images' one program.
	busyboxPath = "/bin/busybox"
)

// applets are the busybox applets the containers use.
var applets = []string{"sh", "cat", "echo", "sleep", "wc"}

// testImage is one S3 image: a shared base layer and a top layer of its own.
type testImage struct {
	name    string // short name: the S3 prefix under images/ and the name file
	payload int64  // bytes of the top layer's payload (0: none)
}

func (i testImage) ref() string    { return "flyio.local/upgrade/" + i.name + ":v1" }
func (i testImage) source() string { return "s3://" + s3Bucket + "/images/" + i.name + "/" }

// fixedTime keeps the layers, and so their diff IDs, the same every run.
var fixedTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// writeImages writes every image's layers under root/images/<name>/ as
// plain tars 1.tar (the shared base: the directory skeleton the daemon's
// layout check wants, busybox and its applets) and 2.tar (the name file,
// and the payload of a big image: bytes of a generator seeded with the
// image's name, so two big images share no layer).
func writeImages(root string, images []testImage) error {
	busybox, err := os.ReadFile(busyboxPath)
	if err != nil {
		return fmt.Errorf("the images' busybox: %w", err)
	}
	for _, img := range images {
		dir := filepath.Join(root, "images", img.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := writeTar(filepath.Join(dir, "1.tar"), func(tw *tar.Writer) error { return baseLayer(tw, busybox) }); err != nil {
			return err
		}
		if err := writeTar(filepath.Join(dir, "2.tar"), func(tw *tar.Writer) error { return topLayer(tw, img) }); err != nil {
			return err
		}
	}
	return nil
}

func writeTar(path string, fill func(*tar.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = fill(tw)
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("layer %s: %w", path, err)
	}
	return nil
}

func baseLayer(tw *tar.Writer, busybox []byte) error {
	for _, d := range []string{"bin/", "dev/", "etc/", "opt/", "proc/", "root/", "run/", "sys/", "tmp/", "usr/", "var/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: fixedTime}); err != nil {
			return err
		}
	}
	if err := writeFile(tw, "bin/busybox", busybox, 0o755); err != nil {
		return err
	}
	for _, a := range applets {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: path.Join("bin", a), Linkname: "busybox", Mode: 0o777, ModTime: fixedTime}); err != nil {
			return err
		}
	}
	return nil
}

func topLayer(tw *tar.Writer, img testImage) error {
	if err := writeFile(tw, namePath[1:], []byte(img.name+"\n"), 0o644); err != nil {
		return err
	}
	if img.payload == 0 {
		return nil
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: payloadPath[1:], Size: img.payload, Mode: 0o644, ModTime: fixedTime}); err != nil {
		return err
	}
	var seed [32]byte
	copy(seed[:], img.name)
	rng := rand.NewChaCha8(seed)
	buf := make([]byte, 1<<20)
	for left := img.payload; left > 0; {
		n := min(left, int64(len(buf)))
		_, _ = rng.Read(buf[:n])
		if _, err := tw.Write(buf[:n]); err != nil {
			return err
		}
		left -= n
	}
	return nil
}

func writeFile(tw *tar.Writer, name string, data []byte, mode int64) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: mode, ModTime: fixedTime}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}
