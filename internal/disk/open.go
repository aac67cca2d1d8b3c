package disk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"loam.dev/loam/internal/atomicfile"
)

// Kinds of Pool, as Pool.Kind returns them and LOAM_DISK takes them.
const (
	KindBtrfs = "btrfs"
	KindCopy  = "copy"
)

// EnvDisk names the environment variable that forces a kind of pool
// (KindBtrfs or KindCopy) instead of picking one.
const EnvDisk = "LOAM_DISK"

// DefaultSize is the size of a btrfs pool's loop image when none is given.
// The image is sparse: it takes host space only as volumes fill it.
const DefaultSize int64 = 64 << 30

// kindFile in a pool directory records which kind of pool it holds. Their
// layouts differ, so opening one kind's directory as the other would make
// every volume look gone.
const kindFile = "kind"

// Open opens the pool in dir. A directory that already holds a pool is
// opened as the kind it is. Otherwise LOAM_DISK, if set, says which kind to
// make; if not, Open makes a btrfs pool (see NewBtrfs; sizeBytes is its
// image's size) and falls back to plain copies, logging why, when btrfs
// does not work here.
func Open(ctx context.Context, dir string, sizeBytes int64) (Pool, error) {
	want := os.Getenv(EnvDisk)
	if want != "" && want != KindBtrfs && want != KindCopy {
		return nil, fmt.Errorf("opening pool in %s: %s=%q: want %q or %q", dir, EnvDisk, want, KindBtrfs, KindCopy)
	}
	have, err := readKind(dir)
	if err != nil {
		return nil, fmt.Errorf("opening pool in %s: %w", dir, err)
	}
	if have != "" && want != "" && have != want {
		return nil, fmt.Errorf("opening pool in %s: it holds a %s pool, but %s=%s", dir, have, EnvDisk, want)
	}
	switch cmp.Or(have, want) {
	case KindBtrfs:
		return NewBtrfs(ctx, dir, sizeBytes)
	case KindCopy:
		return NewCopy(dir)
	}
	b, err := NewBtrfs(ctx, dir, sizeBytes)
	if err == nil {
		return b, nil
	}
	slog.WarnContext(ctx, "btrfs does not work here; volumes will be plain copies, slower and not shared",
		"dir", dir, "err", err)
	return NewCopy(dir)
}

// Destroy deletes the pool in dir and everything in it, unmounting it and
// detaching its loop device: a data dir's teardown. A dir that holds no
// pool is left as it is (no pool is made to be destroyed). Opening the
// pool mounts it again first if it is not mounted (after a reboot).
func Destroy(ctx context.Context, dir string, sizeBytes int64) error {
	kind, err := readKind(dir)
	if err != nil {
		return fmt.Errorf("destroying pool in %s: %w", dir, err)
	}
	if kind == "" {
		return nil
	}
	pool, err := Open(ctx, dir, sizeBytes)
	if err != nil {
		return err
	}
	if d, ok := pool.(interface{ Destroy(context.Context) error }); ok {
		return d.Destroy(ctx)
	}
	return nil
}

// prepareDir creates dir and returns its absolute path with symlinks
// resolved, so that it compares equal to what /proc/self/mountinfo and
// loop devices report.
func prepareDir(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", dir, err)
	}
	return filepath.Abs(real)
}

// readKind returns the kind recorded in dir, or "" if none is.
func readKind(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, kindFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("reading pool kind: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// checkKind fails when dir holds a pool of another kind than kind.
func checkKind(dir, kind string) error {
	have, err := readKind(dir)
	if err != nil {
		return err
	}
	if have != "" && have != kind {
		return fmt.Errorf("%s holds a %s pool, not %s", dir, have, kind)
	}
	return nil
}

// writeKind records kind in dir, durably, once.
func writeKind(dir, kind string) error {
	if have, err := readKind(dir); err != nil || have == kind {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, kindFile), []byte(kind+"\n"), 0o644); err != nil {
		return fmt.Errorf("recording pool kind: %w", err)
	}
	return nil
}
