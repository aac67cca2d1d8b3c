package files

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkExtractTar extracts a tree of 1,000 files of 1 KiB in 20
// directories, the agent's upload path; run it inside a sandbox too
// (gVisor's syscalls cost more than the host's).
func BenchmarkExtractTar(b *testing.B) {
	var entries []tarEntry
	for d := range 20 {
		entries = append(entries, tarEntry{name: fmt.Sprintf("d%02d/", d), typ: tar.TypeDir, mode: 0o755})
		for f := range 50 {
			entries = append(entries, tarEntry{name: fmt.Sprintf("d%02d/f%02d", d, f), typ: tar.TypeReg, body: strings.Repeat("x", 1024)})
		}
	}
	data := fuzzTar(b, entries...)
	base := b.TempDir()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := range b.N {
		dst := filepath.Join(base, fmt.Sprint(i))
		if err := os.Mkdir(dst, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := extractTar(b.Context(), dst, bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}
