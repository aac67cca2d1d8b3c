// Package checkpoint holds the rules of checkpoints that do not depend on
// how a sandbox runs: ids (v1, v2, … never reused; auto-1, auto-2, … for the
// automatic ones), generated names, the per-sandbox limit, which automatic
// checkpoints to prune, and how a checkpoint's data is made durable before
// its record appears, and where a checkpoint's data lives (Dir, Snapshot).
// It takes no checkpoint itself: package checkpoints, the capability,
// takes, restores and forks from them over the sandbox core.
//
// Terms: a memory checkpoint holds a sandbox's memory and disk, and restoring
// it resumes its processes; a disk-only checkpoint holds the disk, and
// restoring it boots fresh; a restore rolls the same sandbox back; a fork is
// a new, independent sandbox made from a checkpoint.
package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// KeepAuto is how many automatic checkpoints a sandbox keeps; older ones
// are deleted when a new one is taken.
const KeepAuto = 5

// UserID is the id of the n-th checkpoint taken on request: v1, v2, ….
func UserID(n int) string { return "v" + strconv.Itoa(n) }

// AutoID is the id of the n-th automatic checkpoint: auto-1, auto-2, ….
func AutoID(n int) string { return "auto-" + strconv.Itoa(n) }

// NewName makes a name for a checkpoint given none, like checkpoint-3f9a1c.
func NewName() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "checkpoint-" + hex.EncodeToString(b)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
var idRE = regexp.MustCompile(`^(v|auto-)[0-9]+$`)

// CheckName refuses a name that is not 1–63 letters, digits, '.', '_' and
// '-' starting with a letter or digit, or that looks like an id (a name
// "v3" would make "v3" mean two checkpoints).
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return api.Errorf(api.CodeInvalid, "name %q: a checkpoint name is 1-63 letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	if idRE.MatchString(name) {
		return api.Errorf(api.CodeInvalid, "name %q: names of the form v1 or auto-1 are kept for checkpoint ids", name)
	}
	return nil
}

// CheckComment refuses comments that would not show well in a table.
func CheckComment(c string) error {
	if len(c) > 1024 {
		return api.Errorf(api.CodeInvalid, "comment: longer than 1024 bytes")
	}
	if strings.ContainsAny(c, "\x00\n\r") {
		return api.Errorf(api.CodeInvalid, "comment: must be one line")
	}
	return nil
}

// Limits is how many checkpoints taken on request a sandbox may have, in
// two shares: its owner's, and those it took of itself from inside. Each
// counts only its own, so that a sandbox filling its share never makes its
// owner's next checkpoint fail (nor the other way round). 0 is no limit.
type Limits struct {
	Owner  int
	Inside int
}

// CheckLimit refuses a new checkpoint asked for by c when c's share of the
// sandbox's checkpoints is full. Automatic ones do not count.
func CheckLimit(c Caller, cps []*store.Checkpoint, l Limits) error {
	limit := l.Owner
	if c == Inside {
		limit = l.Inside
	}
	n := 0
	for _, cp := range cps {
		if !cp.Auto && cp.Inside == (c == Inside) {
			n++
		}
	}
	if limit <= 0 || n < limit {
		return nil
	}
	if c == Inside {
		return api.Errorf(api.CodeLimit, "the sandbox has taken %d checkpoints of itself, the limit of those taken from inside; remove one of them first (loam checkpoint rm)", n)
	}
	return api.Errorf(api.CodeLimit, "the sandbox has %d checkpoints, the limit; remove one first (loam checkpoint rm)", n)
}

// PruneAutos returns the automatic checkpoints to delete so that only the
// newest keep remain. cps is oldest first.
func PruneAutos(cps []*store.Checkpoint, keep int) []*store.Checkpoint {
	var autos []*store.Checkpoint
	for _, cp := range cps {
		if cp.Auto {
			autos = append(autos, cp)
		}
	}
	if len(autos) <= keep {
		return nil
	}
	return autos[:len(autos)-keep]
}

// SyncTree fsyncs every file and directory under dir, then dir's parent, so
// that a rename of dir that follows is durable with all its content. The
// fsyncs run at once: a memory image is a few files, and a filesystem with
// a journal commits concurrent fsyncs together, where one after another
// each waits for a commit (and a cache flush) of its own.
func SyncTree(dir string) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	walkErr := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		wg.Go(func() {
			if err := syncPath(path); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
		return nil
	})
	wg.Wait()
	if err := errors.Join(append(errs, walkErr)...); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return syncPath(filepath.Dir(dir))
}

// Publish renames tmp, whose content SyncTree has made durable, to final,
// and makes the rename durable before it returns: the rename lives in
// final's directory, which is fsynced, and so is every directory above it
// up to root (the data dir), since MkdirAll may have made them for this
// very publication. Only then may a record that points at final be
// stored: a rename not yet on disk is lost with the power, and a record
// that outlived it would point at nothing.
func Publish(tmp, final, root string) error {
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	return SyncDirs(filepath.Dir(final), root)
}

// SyncDirs fsyncs directory dir and each directory above it up to and
// including root, so that the entries made in them (files and directories
// created, renames into them) are durable. root must be dir or above it.
func SyncDirs(dir, root string) error {
	dir, root = filepath.Clean(dir), filepath.Clean(root)
	for {
		if err := syncPath(dir); err != nil {
			return fmt.Errorf("syncing %s: %w", dir, err)
		}
		up := filepath.Dir(dir)
		if dir == root || up == dir {
			return nil
		}
		dir = up
	}
}

func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// MemDir is where a memory checkpoint keeps its memory image, inside its
// directory (Dir).
const MemDir = "mem"

// SandboxDir holds the data of sandbox sandboxID's checkpoints, under the
// daemon's data dir, one directory each (Dir).
func SandboxDir(dataDir, sandboxID string) string {
	return filepath.Join(dataDir, "checkpoints", sandboxID)
}

// Dir holds the data of one checkpoint. It is derived from the ids, never
// stored, so that the data dir can move (or be reached through another
// path) without losing a checkpoint.
func Dir(dataDir, sandboxID, cpID string) string {
	return filepath.Join(SandboxDir(dataDir, sandboxID), cpID)
}

// Snapshot is the name of checkpoint cpID's disk snapshot in the disk pool.
func Snapshot(sandboxID, cpID string) string { return sandboxID + "." + cpID }
