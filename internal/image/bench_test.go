package image

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"loam.dev/loam/internal/image/imagetest"
)

// BenchmarkPullUnpack pulls a 100 MiB image of 10 layers (10 MiB of
// incompressible data each) from a registry on loopback and unpacks it into
// a new directory: the work of a first pull, short of the import into the
// disk pool.
func BenchmarkPullUnpack(b *testing.B) {
	const layers, layerSize = 10, 10 << 20
	rng := rand.New(rand.NewChaCha8([32]byte{}))
	var ls [][]byte
	for i := range layers {
		data := make([]byte, layerSize)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		ls = append(ls, imagetest.Layer(b,
			imagetest.Entry{Name: fmt.Sprintf("data/%d/", i), Type: '5'},
			imagetest.Entry{Name: fmt.Sprintf("data/%d/blob", i), Body: data}))
	}
	reg := imagetest.Registry(b, "", "")
	ref := reg + "/big:v1"
	imagetest.Push(b, ref, imagetest.Image(b, v1.Config{Cmd: []string{"sh"}}, ls...), "", "")
	b.SetBytes(layers * layerSize)
	b.ResetTimer()
	for b.Loop() {
		img, err := open(b.Context(), ref, authn.DefaultKeychain)
		if err != nil {
			b.Fatal(err)
		}
		lrs, err := img.Layers()
		if err != nil {
			b.Fatal(err)
		}
		var read atomic.Int64
		if err := unpackImage(b.Context(), lrs, b.TempDir(), &read); err != nil {
			b.Fatal(err)
		}
	}
}
