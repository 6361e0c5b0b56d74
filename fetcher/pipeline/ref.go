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

// defaultTag is the tag of a default name whose path alone names its
// source.
const defaultTag = "latest"

// DefaultRef is the name of an image pulled from bucket/key without
// --name, one name per source (see imageSource: a key and the same key
// with a trailing '/' are one prefix source).
//
// A prefix whose bucket and path components are already what a reference
// path holds (lowercase letters and digits, single '.', '_' or '-' between,
// no empty component) is named by them: s3://my-bucket/images/app/ is
// s3.local/my-bucket/images/app:latest. Every other source (a layer key,
// whose suffix the name drops, or a path the name would have to lowercase
// or rewrite) gets the readable form, each component lowercased and every
// character a reference may not hold replaced by '-', tagged with the
// image's id, a hash of the exact source: s3://my-bucket/Images/App v2/ is
// s3.local/my-bucket/images/app-v2:s3-<24 hex>. The tag keeps two sources
// the readable form confuses (App/ and app/, app.tar and app.tar.zst)
// apart, and never equals the tag of a name of the first kind, so a
// default name belongs to one source only; it depends on the source alone,
// so it is the same in every release. A readable form too long for a
// reference is cut (the tag still names the source). It is a valid
// reference for containerd, nerdctl and the CRI; an error names the source
// and why when none can be made.
func DefaultRef(bucket, key string) (string, error) {
	source, imageID := imageSource(bucket, key)
	path := strings.TrimPrefix(source, "s3://")
	exact := strings.HasSuffix(path, "/")
	var parts []string
	for _, c := range strings.Split(s3source.LayerBase(strings.TrimSuffix(path, "/")), "/") {
		r := refComponent(c)
		exact = exact && r == c && r != ""
		if r != "" {
			parts = append(parts, r)
		}
	}
	readable := DefaultRefDomain + "/" + strings.Join(parts, "/")
	if len(parts) > 0 && exact {
		name := readable + ":" + defaultTag
		if _, err := reference.ParseNamed(name); err == nil {
			return name, nil
		}
	}
	if len(readable) > reference.NameTotalLengthMax {
		readable = strings.TrimRight(readable[:reference.NameTotalLengthMax], "/._-")
	}
	name := readable + ":" + imageID
	if _, err := reference.ParseNamed(name); err != nil || len(parts) == 0 {
		return "", fmt.Errorf("image %s: no valid default name (%q: %v): pull it with --name", source, name, err)
	}
	return name, nil
}

// CheckName refuses a name an image cannot be registered under in
// containerd, naming it and the rule it breaks: it must be a reference
// ([DOMAIN/]PATH[:TAG], the way containerd's CRI, nerdctl and docker
// parse one), and carry no digest, since the daemon makes the image's
// manifest and no digest given in advance can name it.
func CheckName(name string) error {
	const rule = "an image name is a reference [DOMAIN/]PATH[:TAG]: path components of lowercase letters and digits with single '.', '_' or '-' (or '__') between, separated by '/', at most 255 characters; a tag of at most 128 letters, digits, '_', '.' or '-' not starting with '.' or '-'"
	if name == "" {
		return fmt.Errorf("image name %q: must not be empty (%s)", name, rule)
	}
	n, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return fmt.Errorf("image name %q: %w (%s)", name, err, rule)
	}
	if _, ok := n.(reference.Digested); ok {
		return fmt.Errorf("image name %q: must not carry a digest (@sha256:...): the daemon makes the image's manifest, which no digest given in advance names", name)
	}
	return nil
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
