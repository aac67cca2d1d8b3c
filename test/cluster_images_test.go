package test

import (
	"crypto/rand"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// TestClusterImages: a sandbox of an image goes to the node that has the
// image unpacked. Node b has a template cache of its own (the tests'
// daemons share one otherwise), pulls an image no other test has, and
// reports it with its lease; a create of the image through a, whose host
// has as much memory free, is placed on b, and a logs why.
func TestClusterImages(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	cache, err := os.MkdirTemp("", "loam-e2e-cache-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(cache) })
	a := startNode(t, url, "a", "")
	b := startNode(t, url, "b", a.Token, "--template-cache", cache)
	ctx := harness.Ctx(t)

	reg := imagetest.Registry(t, "", "")
	ref := reg + "/only-b:v1"
	// A layer of its own makes a digest of its own: the shared cache of
	// the tests' daemons, a's, cannot have it.
	imagetest.Push(t, ref, imagetest.Image(t, imagetest.BusyboxConfig, imagetest.Busybox(t),
		imagetest.Layer(t, imagetest.Entry{Name: "etc/only-b", Body: []byte(rand.Text())})), "", "")
	if _, err := b.C.PullImage(ctx, ref); err != nil {
		t.Fatal(err)
	}
	var im *api.Image
	harness.Eventually(t, 60*time.Second, "the image ready", func() error {
		if im, err = a.C.GetImage(ctx, image.ID(ref)); err != nil || im.State != api.ImageReady {
			return fmt.Errorf("image %+v, %v", im, err)
		}
		return nil
	})
	tree := "image-" + strings.TrimPrefix(im.Digest, "sha256:")[:16] + "-"
	has := func(n api.Node) bool {
		return slices.ContainsFunc(n.Images, func(e string) bool { return strings.HasPrefix(e, tree) })
	}
	// Once b's lease lists it, a's view of the nodes (read after each of
	// its own renewals) has it after a's second renewal from then.
	var listed, renewed time.Time
	harness.Eventually(t, 20*time.Second, "b's lease listing the image", func() error {
		nodes := a.nodes(t)
		if has(nodes["a"]) {
			t.Fatalf("a's lease lists image %s, which only b pulled: %v", im.Digest, nodes["a"].Images)
		}
		if !has(nodes["b"]) {
			return fmt.Errorf("b's images %v", nodes["b"].Images)
		}
		listed = nodes["b"].RenewedAt
		return nil
	})
	harness.Eventually(t, 20*time.Second, "a renewing twice", func() error {
		at := a.nodes(t)["a"].RenewedAt
		if !at.After(listed) {
			return fmt.Errorf("a renewed at %s, b listed it at %s", at, listed)
		}
		if renewed.IsZero() {
			renewed = at
		}
		if !at.After(renewed) {
			return fmt.Errorf("a renewed once since")
		}
		return nil
	})

	sb, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "of-image", Image: ref})
	if err != nil {
		t.Fatalf("a sandbox of the image through a: %v", err)
	}
	if sb.Node != "b" {
		t.Errorf("the sandbox of the image b has is on %q, want b", sb.Node)
	}
	if log := a.Log.String(); !strings.Contains(log, "has image "+ref+" cached") {
		t.Errorf("a's log gives no reason naming the image:\n%s", log)
	}
	if out := a.Run("of-image", "cat", "/etc/only-b"); out == "" {
		t.Errorf("the sandbox's image lacks its own file")
	}
}
