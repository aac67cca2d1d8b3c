package checkpoint

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/store"
)

// SyncVolume flushes the filesystem a volume lives on, so that a snapshot
// just taken of it (a checkpoint's, a template's) is on disk.
func SyncVolume(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return nil
}

// TreeBytes is the size of the files under dir (0 when it is missing): a
// memory image's, a snapshot's.
func TreeBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// Source is a checkpoint held as the source of a copy (a template made of
// it): neither it nor its sandbox is deleted until the holder lets go.
type Source struct {
	// Sandbox is the name of the checkpoint's sandbox, SecretFiles the
	// files its secrets were written to (paths in the sandbox).
	Sandbox     string
	SecretFiles map[string]string
	Checkpoint  *store.Checkpoint
	// Snapshot is the disk pool's snapshot of its disk; MemDir the
	// directory of its memory image (a memory checkpoint's).
	Snapshot string
	MemDir   string
	// AgentToken is the token its agent held when it was taken: the one a
	// copy of its memory wakes up holding.
	AgentToken string
}

// LinkTree makes dst a copy of the directory tree src by hard links (a
// memory image's files are written once and never changed), or by copies
// where links cannot be made (another filesystem).
func LinkTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		if err := os.Link(path, to); err == nil {
			return nil
		}
		return copyFile(path, to)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
