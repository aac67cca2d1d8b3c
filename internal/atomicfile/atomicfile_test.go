package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// only lists dir and fails t unless it holds exactly names: no temporary
// file may be left beside the one written.
func only(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}

func check(t *testing.T, path, content string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != content {
		t.Errorf("%s holds %q, want %q", path, b, content)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != perm {
		t.Errorf("%s has mode %v, want %v", path, st.Mode().Perm(), perm)
	}
}

func TestWriteFile(t *testing.T) {
	old := syscall.Umask(0o077) // the mode asked for must win over the umask
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	check(t, path, "one", 0o644)
	if err := WriteFile(path, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	check(t, path, "two", 0o600)
	only(t, dir, "f")
}

func TestWriteFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Write(path, 0o600, func(w io.Writer) error {
		if _, err := w.Write([]byte("half")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), path) {
		t.Errorf("Write: %v, want %v naming %s", err, boom, path)
	}
	check(t, path, "old", 0o640)
	only(t, dir, "f")
}

func TestWriteFileMissingDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "f")
	if err := WriteFile(path, []byte("x"), 0o644); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("WriteFile into a missing directory: %v, want not exist", err)
	}
}

func TestReplace(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := Replace(path, strings.NewReader("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	check(t, path, "one", 0o644)
	boom := errors.New("boom")
	if err := Replace(path, io.MultiReader(strings.NewReader("half"), errReader{boom}), 0o600); !errors.Is(err, boom) {
		t.Errorf("Replace from a failing reader: %v, want %v", err, boom)
	}
	check(t, path, "one", 0o644)
	only(t, dir, "f")
}

func TestSyncDir(t *testing.T) {
	if err := SyncDir(t.TempDir()); err != nil {
		t.Error(err)
	}
	missing := filepath.Join(t.TempDir(), "no")
	if err := SyncDir(missing); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("SyncDir of a missing directory: %v, want not exist naming it", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
