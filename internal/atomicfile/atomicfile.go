// Package atomicfile writes a file whole or not at all, and says once what
// makes such a write durable.
//
// The rules, written here and nowhere else: the new content goes to a
// temporary file in the destination's own directory (a rename is atomic
// only within one filesystem), the file is fsynced before the rename (or
// a crash may leave a renamed but empty file: ext4's data=ordered does not
// order a rename after the data), and the directory is fsynced after it
// (or the rename itself may be lost with the power). The temporary file and
// the file fsync come from github.com/google/renameio/v2, which does not
// fsync the directory; SyncDir does.
//
// Replace is the same write without the fsyncs, for files that need only
// be seen whole and are worth no flush (a runtime config rewritten at each
// boot, a user's copy from a sandbox).
package atomicfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// WriteFile writes data to path whole or not at all, durably: once it
// returns nil, path holds data (with mode perm, whatever the umask) even
// after a crash or a power loss. The error names path.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write is WriteFile for content written by fill as it goes. If fill
// fails, path is left as it was and the error is fill's, wrapped.
func Write(path string, perm fs.FileMode, fill func(w io.Writer) error) error {
	dir := filepath.Dir(path)
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(perm))
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer f.Cleanup() //nolint:errcheck // a no-op after the rename; before it, the write's error is the one to return
	if err := fill(f); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return SyncDir(dir)
}

// Replace writes what r yields to path whole or not at all, with mode perm
// whatever the umask, but not durably: readers see the old file or the
// whole new one, and after a crash path may hold either, or, on some
// filesystems, an empty file. For files that are rewritten at each use.
func Replace(path string, r io.Reader, perm fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".loam-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly after the rename
	_, err = io.Copy(tmp, r)
	if err == nil {
		err = tmp.Chmod(perm) // not CreateTemp's mode: the umask must not change it
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// SyncDir makes the entries of directory dir durable: the files created in
// it, removed from it and renamed into or out of it.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
