package main

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// reference is the CLI reference in the repository, from this directory.
const reference = "../../docs/reference/cli"

// TestReferenceUpToDate fails when docs/reference/cli is not what the
// commands generate now: a page missing, left over, or different.
func TestReferenceUpToDate(t *testing.T) {
	fresh := t.TempDir()
	if err := generate(fresh); err != nil {
		t.Fatal(err)
	}
	want := pages(t, fresh)
	got := pages(t, reference)
	if len(want) == 0 {
		t.Fatal("the generator wrote no pages")
	}
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s/%s is missing", reference, name)
		case !bytes.Equal(g, w):
			t.Errorf("%s/%s is stale", reference, name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s/%s is no command's page", reference, name)
		}
	}
	if t.Failed() {
		t.Log("regenerate the reference: go generate ./internal/cli")
	}
}

// TestGenerateDeterministic: two runs write the same pages, whatever LOAM_*
// variables are set, and no page carries a date.
func TestGenerateDeterministic(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	if err := generate(a); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LOAM_LISTEN", "0.0.0.0:9999")
	t.Setenv("LOAM_DATA_DIR", "/elsewhere")
	if err := generate(b); err != nil {
		t.Fatal(err)
	}
	pa, pb := pages(t, a), pages(t, b)
	names := make([]string, 0, len(pa))
	for name := range pa {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !bytes.Equal(pa[name], pb[name]) {
			t.Errorf("%s differs between two runs", name)
		}
		if bytes.Contains(pa[name], []byte("Auto generated")) {
			t.Errorf("%s has an auto-generated tag (with a date)", name)
		}
	}
	if !bytes.Contains(pa["loam_serve.md"], []byte(`"/var/lib/loam"`)) {
		t.Errorf("loam_serve.md does not show the data dir's default, /var/lib/loam")
	}
}

func pages(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string][]byte, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m[filepath.Base(f)] = b
	}
	return m
}
