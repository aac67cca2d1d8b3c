package disk

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
)

// ReserveBytes is the room in the data dir that work refused up front must
// leave free beside its own need: the store, the logs, sandboxes' bundles
// and runsc state are written there too, and a btrfs pool needs room for
// metadata even to delete what would free space.
const ReserveBytes = 64 << 20

// FreeBytes is the space an unprivileged writer can still use on the
// filesystem dir is on.
// A dir not made yet is on the filesystem of its nearest parent that is.
func FreeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	for {
		err := unix.Statfs(dir, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize), nil
		}
		parent := filepath.Dir(dir)
		if !errors.Is(err, unix.ENOENT) || parent == dir {
			return 0, fmt.Errorf("reading the free space of %s: %w", dir, err)
		}
		dir = parent
	}
}

// RequireSpace refuses, as insufficient_storage, work (what) that needs
// need bytes in the data dir dir when the free space cannot hold it and
// ReserveBytes beside. A statfs that fails refuses nothing: the work then
// fails on its own if it must.
func RequireSpace(dir, what string, need int64) error {
	free, err := FreeBytes(dir)
	if err != nil || free >= need+ReserveBytes {
		return nil
	}
	if need <= 0 {
		return api.Errorf(api.CodeInsufficientStorage, "not enough space in the data dir for %s: %s free, %s kept in reserve",
			what, humanize.IBytes(uint64(max(free, 0))), humanize.IBytes(ReserveBytes))
	}
	if free >= need {
		return api.Errorf(api.CodeInsufficientStorage, "not enough space in the data dir for %s of %s: %s free, %s kept in reserve",
			what, humanize.IBytes(uint64(need)), humanize.IBytes(uint64(free)), humanize.IBytes(ReserveBytes))
	}
	return api.Errorf(api.CodeInsufficientStorage, "not enough space in the data dir for %s of %s: %s free",
		what, humanize.IBytes(uint64(need)), humanize.IBytes(uint64(max(free, 0))))
}

// IsNoSpace reports whether err is a host filesystem out of room: ENOSPC or
// EDQUOT, or a host tool or SQLite saying so in words. Call it
// only on errors of host-side work: a sandbox's own full disk, as its
// agent reports it, is the sandbox's business, not the host's.
func IsNoSpace(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	// runsc, btrfs and cp say it in words on stderr; they run on the host.
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "no space left on device") || strings.Contains(msg, "database or disk is full")
}

// SpaceError turns err, from host-side work (what) in the data dir dir,
// into insufficient_storage when the host ran out of room, naming what was
// short; any other error is returned as it is. The cause is logged by the
// caller: it holds host paths.
func SpaceError(err error, dir, what string) error {
	if !IsNoSpace(err) {
		return err
	}
	free, ferr := FreeBytes(dir)
	if ferr != nil {
		return api.Errorf(api.CodeInsufficientStorage, "the data dir ran out of space during %s", what)
	}
	return api.Errorf(api.CodeInsufficientStorage, "the data dir ran out of space during %s: %s free now; nothing of it was kept",
		what, humanize.IBytes(uint64(max(free, 0))))
}
