package disk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// layout is the directory structure both pools share under their root:
//
//	templates/<name>   read-only template trees
//	volumes/<id>       writable volumes
//	snapshots/<snap>   read-only snapshots of volumes
//	tmp/               work in progress; anything here is garbage after a crash
//
// Work happens in tmp/ and moves into place in one step, so the three
// listed directories only ever hold complete entries.
type layout struct {
	root string
}

const (
	templatesDir = "templates"
	volumesDir   = "volumes"
	snapshotsDir = "snapshots"
	tmpDir       = "tmp"
)

func (l layout) templatePath(name string) string {
	return filepath.Join(l.root, templatesDir, name)
}

func (l layout) volumePath(id string) string {
	return filepath.Join(l.root, volumesDir, id)
}

func (l layout) snapshotPath(snap string) string {
	return filepath.Join(l.root, snapshotsDir, snap)
}

// tempPath returns a fresh, unused path in tmp/ whose name says what it is
// for, to make leftovers readable.
func (l layout) tempPath(what, name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux.
	return filepath.Join(l.root, tmpDir, what+"-"+name+"-"+hex.EncodeToString(b[:]))
}

// create makes the layout's directories.
func (l layout) create() error {
	for _, d := range []string{templatesDir, volumesDir, snapshotsDir, tmpDir} {
		if err := os.MkdirAll(filepath.Join(l.root, d), 0o755); err != nil {
			return fmt.Errorf("creating pool directory: %w", err)
		}
	}
	return nil
}

// list returns the sorted names in one of the layout's directories.
func (l layout) list(sub string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(l.root, sub))
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", sub, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.IsDir() && validName(e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// tempEntries returns the paths left in tmp/, which are garbage once the
// pool's owner restarts.
func (l layout) tempEntries() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(l.root, tmpDir))
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", tmpDir, err)
	}
	paths := make([]string, 0, len(entries))
	for _, e := range entries {
		paths = append(paths, filepath.Join(l.root, tmpDir, e.Name()))
	}
	return paths, nil
}

// validName rejects names that are not a single path element, and names
// starting with a dot, which are kept for work in progress.
func validName(name string) error {
	switch {
	case name == "", len(name) > 200, strings.HasPrefix(name, "."),
		strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("invalid name %q: want a non-empty path element not starting with a dot", name)
	}
	return nil
}

// validNames checks several names with validName.
func validNames(names ...string) error {
	for _, n := range names {
		if err := validName(n); err != nil {
			return err
		}
	}
	return nil
}

// exists reports whether path exists, and fails only when it cannot tell.
func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}

// renameNoReplace moves old to new, failing with ErrExists instead of
// replacing new (rename(2) would silently replace an empty directory).
func renameNoReplace(oldPath, newPath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldPath, unix.AT_FDCWD, newPath, unix.RENAME_NOREPLACE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOTEMPTY):
		return fmt.Errorf("renaming %s to %s: %w", oldPath, newPath, ErrExists)
	default:
		return fmt.Errorf("renaming %s to %s: %w", oldPath, newPath, err)
	}
}

// syncFS flushes the filesystem holding path. Fsyncing each file of a
// copied tree would be thousands of calls; one syncfs does the same job.
func syncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("syncing filesystem of %s: %w", path, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncing filesystem of %s: %w", path, err)
	}
	return nil
}

// removeTree removes dir and everything below it. It first detaches any
// mount below dir: a build killed half-way (debootstrap mounts /proc, and
// in containers binds the host's /dev, into its target) must not make us
// delete through a mount into the host's files.
func removeTree(dir string) error {
	if err := unmountBelow(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

// keyedLock is a set of mutexes by name whose Lock gives up when its context
// ends. Entries are dropped when nobody holds or waits for them.
type keyedLock struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	ch   chan struct{} // holds one token while locked
	refs int           // holders and waiters
}

// lock takes the lock for key, waiting until it is free or ctx ends, and
// returns the function that releases it.
func (k *keyedLock) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = make(map[string]*keyLock)
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	select {
	case l.ch <- struct{}{}:
		return func() {
			<-l.ch
			k.release(key, l)
		}, nil
	case <-ctx.Done():
		k.release(key, l)
		return nil, context.Cause(ctx)
	}
}

// lockPair takes the locks for two keys, always in the same order, so that
// two callers taking the same pair cannot deadlock.
func (k *keyedLock) lockPair(ctx context.Context, a, b string) (unlock func(), err error) {
	if b < a {
		a, b = b, a
	}
	ua, err := k.lock(ctx, a)
	if err != nil {
		return nil, err
	}
	ub, err := k.lock(ctx, b)
	if err != nil {
		ua()
		return nil, err
	}
	return func() { ub(); ua() }, nil
}

// renameVolume moves volume from to to under both their locks, failing
// with ErrNotFound when from is missing and ErrExists when to is there.
func (l layout) renameVolume(ctx context.Context, locks *keyedLock, from, to string) error {
	if err := validNames(from, to); err != nil {
		return err
	}
	unlock, err := locks.lockPair(ctx, "v/"+from, "v/"+to)
	if err != nil {
		return err
	}
	defer unlock()
	if err := mustExist(l.volumePath(from)); err != nil {
		return fmt.Errorf("renaming volume %s to %s: %w", from, to, err)
	}
	if err := renameNoReplace(l.volumePath(from), l.volumePath(to)); err != nil {
		return fmt.Errorf("renaming volume %s to %s: %w", from, to, err)
	}
	return nil
}

func (k *keyedLock) release(key string, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l.refs--
	if l.refs == 0 {
		delete(k.locks, key)
	}
}
