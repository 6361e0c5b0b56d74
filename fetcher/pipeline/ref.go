package pipeline

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/distribution/reference"

	"github.com/flyio-snapshotter/containerd-flyio-snapshotter/fetcher/s3source"
)

// DefaultRefDomain is the registry-like domain of the names pull gives
// images pulled without --name: it has a dot, so containerd, nerdctl and
// the CRI read it as a domain and never as a Docker Hub user.
const DefaultRefDomain = "s3.local"

// DefaultRef is the name of an image pulled from bucket/key without
// --name: "s3.local/<bucket>/<key without its layer suffix (.tar, .tar.gz,
// .tar.zst) or trailing />:latest", each
// path component lowercased, with every character a reference may not hold
// replaced by '-' (s3://my-bucket/Images/App v2/ is
// s3.local/my-bucket/images/app-v2:latest). It is a valid reference for
// containerd, nerdctl and the CRI; an error names the source and why when
// none can be made.
func DefaultRef(bucket, key string) (string, error) {
	key = s3source.LayerBase(strings.TrimSuffix(key, "/"))
	var parts []string
	for _, c := range strings.Split(bucket+"/"+key, "/") {
		if c = refComponent(c); c != "" {
			parts = append(parts, c)
		}
	}
	name := DefaultRefDomain + "/" + strings.Join(parts, "/") + ":latest"
	if _, err := reference.ParseNamed(name); err != nil || len(parts) == 0 {
		return "", fmt.Errorf("image %s: no valid default name (%q: %v): pull it with --name", S3URL(bucket, key), name, err)
	}
	return name, nil
}

// refComponent is c lowercased, with runs of characters a reference path
// component may not hold, and runs of several separators, replaced by one
// '-', and separators trimmed from both ends (a component starts and ends
// with a letter or digit, with single '.', '_' or '-' between).
func refComponent(c string) string {
	c = refInvalid.ReplaceAllString(strings.ToLower(c), "-")
	c = refSeparators.ReplaceAllString(c, "-")
	return strings.Trim(c, "._-")
}

var (
	refInvalid    = regexp.MustCompile(`[^a-z0-9._-]+`)
	refSeparators = regexp.MustCompile(`[._-]{2,}`)
)
