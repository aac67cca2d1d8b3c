package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"loam.dev/loam/api"
)

// platform is the one sandboxes run: gVisor runs amd64 code here.
var platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Canonical is ref as loam keeps it: a registry reference in full
// (index.docker.io/library/python:3.12-slim, a tag of latest when none is
// given), or an absolute path, cleaned, for an OCI layout directory or a
// `docker save` tarball on the daemon's host. A bad reference is invalid.
func Canonical(ref string) (string, error) {
	if ref == "" {
		return "", api.Errorf(api.CodeInvalid, "ref: give an image reference")
	}
	if filepath.IsAbs(ref) {
		return filepath.Clean(ref), nil
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", api.Errorf(api.CodeInvalid, "ref: %q is not an image reference: %s", ref, err)
	}
	return r.Name(), nil
}

// ID is the id of the image whose canonical reference is ref.
func ID(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return "im-" + hex.EncodeToString(sum[:])[:12]
}

// open finds the image ref (canonical) names: in a registry with the
// credentials keychain finds, or on the host.
func open(ctx context.Context, ref string, keychain authn.Keychain) (v1.Image, error) {
	if !filepath.IsAbs(ref) {
		r, err := name.ParseReference(ref)
		if err != nil {
			return nil, api.Errorf(api.CodeInvalid, "ref: %q is not an image reference: %s", ref, err)
		}
		img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(keychain), remote.WithPlatform(platform))
		if err != nil {
			return nil, fmt.Errorf("fetching %s: %w", ref, err)
		}
		return img, nil
	}
	st, err := os.Stat(ref)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", ref, err)
	}
	if !st.IsDir() {
		img, err := tarball.ImageFromPath(ref, nil)
		if err != nil {
			return nil, fmt.Errorf("opening %s as a docker save tarball: %w", ref, err)
		}
		return img, nil
	}
	idx, err := layout.ImageIndexFromPath(ref)
	if err != nil {
		return nil, fmt.Errorf("opening %s as an OCI layout: %w", ref, err)
	}
	return fromIndex(idx)
}

// fromIndex picks the image for our platform from an index, or its only
// image when none says which platform it is for.
func fromIndex(idx v1.ImageIndex) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading the index: %w", err)
	}
	var pick *v1.Descriptor
	for i, d := range m.Manifests {
		if d.Platform != nil && d.Platform.Satisfies(platform) {
			pick = &m.Manifests[i]
			break
		}
		if d.Platform == nil && pick == nil {
			pick = &m.Manifests[i]
		}
	}
	if pick == nil {
		return nil, errors.New("no image for linux/amd64 in the index")
	}
	if pick.MediaType.IsIndex() {
		sub, err := idx.ImageIndex(pick.Digest)
		if err != nil {
			return nil, err
		}
		return fromIndex(sub)
	}
	return idx.Image(pick.Digest)
}
