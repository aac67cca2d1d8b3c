package disk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// mountEntry is one line of /proc/self/mountinfo, the parts we use.
type mountEntry struct {
	point  string // where it is mounted
	fsType string
	source string // e.g. /dev/loop3
}

// mounts lists the mounts of this process's mount namespace, in mount
// order (a later entry at the same point hides an earlier one).
func mounts() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		before, after, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pre, post := strings.Fields(before), strings.Fields(after)
		if len(pre) < 5 || len(post) < 2 {
			continue
		}
		out = append(out, mountEntry{
			point:  unescapeMount(pre[4]),
			fsType: post[0],
			source: unescapeMount(post[1]),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	return out, nil
}

// unescapeMount undoes the kernel's octal escapes (\040 for a space) in
// mountinfo fields.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// mountAt returns the topmost mount at exactly point, if any.
func mountAt(point string) (mountEntry, bool, error) {
	all, err := mounts()
	if err != nil {
		return mountEntry{}, false, err
	}
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].point == point {
			return all[i], true, nil
		}
	}
	return mountEntry{}, false, nil
}

// unmountBelow detaches every mount at or below dir, deepest first.
func unmountBelow(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	} else if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	all, err := mounts()
	if err != nil {
		return err
	}
	var points []string
	for _, m := range all {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			points = append(points, m.point)
		}
	}
	// Longest first: children before their parents. Reverse mount order
	// breaks ties between stacked mounts at one point.
	slices.Reverse(points)
	slices.SortStableFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		// MNT_DETACH: a busy mount must still stop being reachable from
		// the tree we are about to delete.
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmounting %s: %w", p, err)
		}
	}
	return nil
}

// isBtrfs reports whether path is on a btrfs filesystem.
func isBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("checking filesystem of %s: %w", path, err)
	}
	return st.Type == unix.BTRFS_SUPER_MAGIC, nil
}

// loopDevices returns the loop devices (/dev/loopN) backed by file.
func loopDevices(file string) ([]string, error) {
	file, err := filepath.EvalSymlinks(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("finding loop devices of %s: %w", file, err)
	}
	backing, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, fmt.Errorf("finding loop devices of %s: %w", file, err)
	}
	var devs []string
	for _, b := range backing {
		data, err := os.ReadFile(b)
		if err != nil {
			continue // detached meanwhile
		}
		if strings.TrimSpace(string(data)) == file {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(b))))
		}
	}
	return devs, nil
}

// Teardown unmounts every mount at or below dir, deepest first, and
// detaches the loop devices backed by files directly under dir: what is
// left of a pool (and anything else mounted in a data dir) once the pool
// is destroyed, so that dir can be removed. Only for a dir no daemon uses.
func Teardown(ctx context.Context, dir string) error {
	if err := unmountBelow(dir); err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return fmt.Errorf("tearing down %s: %w", dir, err)
	}
	for _, f := range files {
		devs, err := loopDevices(f)
		if err != nil {
			return fmt.Errorf("tearing down %s: %w", dir, err)
		}
		for _, dev := range devs {
			if _, err := run(ctx, "losetup", "-d", dev); err != nil {
				return fmt.Errorf("tearing down %s: detaching %s: %w", dir, dev, err)
			}
		}
	}
	return nil
}
