package objects

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fileStore is a Store on a file:// bucket in a temporary directory.
func fileStore(t *testing.T) *Store {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(t.Context(), "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestFileStore(t *testing.T) { runSuite(t, fileStore) }

// runSuite runs what every object store must do on stores open makes
// (each new and empty).
func runSuite(t *testing.T, open func(t *testing.T) *Store) {
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context, t *testing.T, s *Store)
	}{
		{"Blobs", testBlobs},
		{"Corrupt", testCorrupt},
		{"Manifests", testManifests},
		{"HostileManifest", testHostileManifest},
		{"Sweep", testSweep},
		{"Cache", testCache},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t.Context(), t, open(t)) })
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// testBlobs: a file stored is read back as it was, by its digest; the
// same bytes again are the same blob; progress counts up to its size.
func testBlobs(ctx context.Context, t *testing.T, s *Store) {
	src := filepath.Join(t.TempDir(), "mem")
	body := strings.Repeat("memory image ", 10_000)
	writeFile(t, src, body)
	var last int64
	b, err := s.PutFile(ctx, src, func(n int64) { last = n })
	if err != nil {
		t.Fatal(err)
	}
	if b.Size != int64(len(body)) || !strings.HasPrefix(b.Digest, "sha256:") || last != b.Size {
		t.Errorf("PutFile: %+v, progress %d; want %d bytes", b, last, len(body))
	}
	again, err := s.PutFile(ctx, src, nil)
	if err != nil || again != b {
		t.Errorf("the same bytes again: %+v, %v; want %+v", again, err, b)
	}
	dst := filepath.Join(t.TempDir(), "got")
	if err := s.Fetch(ctx, b, dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); string(got) != body {
		t.Errorf("fetched %d bytes, not what was stored", len(got))
	}
	missing := Blob{Digest: "sha256:" + strings.Repeat("0", 64), Size: 3}
	if err := s.Fetch(ctx, missing, dst+"2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("fetching a blob never stored: %v, want ErrNotFound", err)
	}
	if _, err := s.Open(ctx, Blob{Digest: "md5:abc"}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a digest that is none: %v, want ErrCorrupt", err)
	}
}

// testCorrupt: an object whose bytes are not its digest's (changed in
// place, cut short, grown) is refused, and no file is left where the
// fetch would have put it.
func testCorrupt(ctx context.Context, t *testing.T, s *Store) {
	src := filepath.Join(t.TempDir(), "disk")
	writeFile(t, src, "the disk of a checkpoint")
	b, err := s.PutFile(ctx, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := b.key()
	for _, bad := range []string{"THE disk of a checkpoint", "the disk", "the disk of a checkpoint, and more"} {
		if err := s.b.WriteAll(ctx, key, []byte(bad), nil); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		dst := filepath.Join(dir, "got")
		if err := s.Fetch(ctx, b, dst); !errors.Is(err, ErrCorrupt) {
			t.Errorf("fetching %q stored for %q: %v, want ErrCorrupt", bad, "the disk of a checkpoint", err)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("a corrupt fetch left %v", left)
		}
	}
	// Stored again, it is good again.
	if err := s.b.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutFile(ctx, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Fetch(ctx, b, filepath.Join(t.TempDir(), "got")); err != nil {
		t.Errorf("fetching it once stored again: %v", err)
	}
}

// testManifests: a directory stored and its manifest written are read
// back whole; a manifest deleted is gone, and listed no more.
func testManifests(ctx context.Context, t *testing.T, s *Store) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "checkpoint.img"), strings.Repeat("m", 5000))
	writeFile(t, filepath.Join(dir, "disk", "home.btrfs"), "home")
	writeFile(t, filepath.Join(dir, "meta.json"), `{"id":"v1"}`)
	var done, total int64
	files, err := s.PutDir(ctx, dir, func(d, t int64) { done, total = d, t })
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 || done != 5000+4+11 || total != done {
		t.Errorf("PutDir: %d files, progress %d of %d", len(files), done, total)
	}
	if _, err := s.GetManifest(ctx, "sb-1/v1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a manifest not written yet: %v, want ErrNotFound", err)
	}
	m := &Manifest{Files: files, Meta: []byte(`{"runsc":"x"}`)}
	if err := s.PutManifest(ctx, "sb-1/v1", m); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetManifest(ctx, "sb-1/v1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Size() != 5015 || string(got.Meta) != `{"runsc":"x"}` || got.Created.IsZero() {
		t.Errorf("the manifest read back: %+v", got)
	}
	out := filepath.Join(t.TempDir(), "restored")
	if err := s.FetchDir(ctx, got.Files, out); err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]string{"disk/home.btrfs": "home", "meta.json": `{"id":"v1"}`} {
		if b, _ := os.ReadFile(filepath.Join(out, rel)); string(b) != want {
			t.Errorf("%s fetched: %q, want %q", rel, b, want)
		}
	}
	if names, err := s.Manifests(ctx, "sb-1/"); err != nil || len(names) != 1 || names[0] != "sb-1/v1" {
		t.Errorf("Manifests(sb-1/): %v, %v", names, err)
	}
	if err := s.DeleteManifest(ctx, "sb-1/v1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteManifest(ctx, "sb-1/v1"); err != nil {
		t.Errorf("deleting it again: %v, want no error", err)
	}
	if names, _ := s.Manifests(ctx, ""); len(names) != 0 {
		t.Errorf("manifests after the delete: %v", names)
	}
	for _, bad := range []string{"", "../x", "/x", "a//b", "a/./b", "a/b/", "a b"} {
		if err := s.PutManifest(ctx, bad, &Manifest{}); err == nil {
			t.Errorf("PutManifest(%q): no error", bad)
		}
	}
}

// testHostileManifest: a manifest in the store is not trusted: a file
// path that would leave the directory it is fetched into, or a digest
// that is none, makes it corrupt.
func testHostileManifest(ctx context.Context, t *testing.T, s *Store) {
	good := `"sha256:` + strings.Repeat("a", 64) + `"`
	for name, body := range map[string]string{
		"up":     `{"files":{"../../etc/passwd":{"digest":` + good + `,"size":1}}}`,
		"abs":    `{"files":{"/etc/passwd":{"digest":` + good + `,"size":1}}}`,
		"digest": `{"files":{"f":{"digest":"sha256:../../x","size":1}}}`,
		"json":   `{"files":`,
	} {
		if err := s.b.WriteAll(ctx, manifestsPrefix+name+".json", []byte(body), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetManifest(ctx, name); !errors.Is(err, ErrCorrupt) {
			t.Errorf("manifest %s (%s): %v, want ErrCorrupt", name, body, err)
		}
	}
	if err := s.FetchDir(ctx, map[string]Blob{"../escape": {Digest: "sha256:" + strings.Repeat("a", 64)}}, t.TempDir()); !errors.Is(err, ErrCorrupt) {
		t.Errorf("FetchDir of a path out of its dir: %v, want ErrCorrupt", err)
	}
	// Sweep reads every manifest: one it cannot read stops it, rather
	// than let it delete a blob that manifest might name.
	if _, err := s.Sweep(ctx, 0); err == nil {
		t.Error("Sweep with a corrupt manifest in the store: no error")
	}
}

// testSweep: blobs no manifest names go, once older than the grace;
// those a manifest names stay.
func testSweep(ctx context.Context, t *testing.T, s *Store) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "named"), "named")
	writeFile(t, filepath.Join(dir, "orphan"), "orphan")
	named, err := s.PutFile(ctx, filepath.Join(dir, "named"), nil)
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := s.PutFile(ctx, filepath.Join(dir, "orphan"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutManifest(ctx, "keep", &Manifest{Files: map[string]Blob{"named": named}}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(ctx, time.Hour); err != nil || n != 0 {
		t.Errorf("Sweep within the grace: %d, %v; want none deleted", n, err)
	}
	if n, err := s.Sweep(ctx, -time.Minute); err != nil || n != 1 {
		t.Errorf("Sweep: %d, %v; want the orphan deleted", n, err)
	}
	if err := s.Fetch(ctx, orphan, filepath.Join(dir, "o2")); !errors.Is(err, ErrNotFound) {
		t.Errorf("the orphan after the sweep: %v, want ErrNotFound", err)
	}
	if err := s.Fetch(ctx, named, filepath.Join(dir, "n2")); err != nil {
		t.Errorf("the named blob after the sweep: %v", err)
	}
}

// testCache: a blob fetched once is served from the cache; past its
// size, the least recently used blobs go first.
func testCache(ctx context.Context, t *testing.T, s *Store) {
	src := t.TempDir()
	var blobs []Blob
	for _, name := range []string{"one", "two", "xtra"} {
		writeFile(t, filepath.Join(src, name), strings.Repeat(name[:1], 400))
		b, err := s.PutFile(ctx, filepath.Join(src, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, b)
	}
	c, err := NewCache(filepath.Join(t.TempDir(), "cache"), 1000)
	if err != nil {
		t.Fatal(err)
	}
	get := func(b Blob) string {
		t.Helper()
		p, err := c.Get(ctx, s, b)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p0 := get(blobs[0])
	if body, _ := os.ReadFile(p0); !bytes.Equal(body, bytes.Repeat([]byte("o"), 400)) {
		t.Fatalf("the cached blob: %q", body)
	}
	// Served from the cache: the store's copy gone does not matter.
	key, _ := blobs[0].key()
	if err := s.b.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if get(blobs[0]) != p0 {
		t.Error("a cached blob fetched again")
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(p0, old, old) // used long ago
	p1 := get(blobs[1])
	get(blobs[2]) // 1200 bytes > 1000: the least recently used goes
	if _, err := os.Stat(p0); !os.IsNotExist(err) {
		t.Errorf("the least recently used blob is still cached (%v)", err)
	}
	if _, err := os.Stat(p1); err != nil {
		t.Errorf("a recently used blob was evicted: %v", err)
	}
	if n := c.Size(); n != 800 {
		t.Errorf("the cache holds %d bytes, want 800", n)
	}
}
