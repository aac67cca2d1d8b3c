package disk_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/disk"
)

const mib = 1 << 20

// fill writes n MiB to a new file at path and syncs it, returning the first
// error.
func fill(path string, n int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	buf := make([]byte, mib)
	for i := 0; i < n && err == nil; i++ {
		_, err = f.Write(buf)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// commit makes btrfs commit its transaction, which is when it updates the
// quota counters.
func commit(t testing.TB, path string) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(fd)
	must(t, unix.Syncfs(fd))
}

// base is the template the tests' volumes are made from.
var base = disk.Base{Template: "t"}

// use is volume id's use beyond base and its limit, failing the test on
// error.
func use(t testing.TB, p disk.Limiter, id string) (used, limit int64) {
	t.Helper()
	used, limit, err := p.DiskUse(t.Context(), id, base)
	must(t, err)
	return used, limit
}

// TestBtrfsQuota is the disk side of resources.disk_mib: a volume that
// fills its limit gets EDQUOT, a neighbour does not, the template's data is
// not counted, a full volume can still be snapshotted, and a clone of the
// snapshot (a restore, a fork) starts with what the snapshot holds and the
// limit its volume had.
func TestBtrfsQuota(t *testing.T) {
	p := newBtrfs(t)
	ctx := t.Context()
	if p.Quotas() != "qgroup" {
		t.Fatalf("Quotas() = %q on the pool's own image, want qgroup", p.Quotas())
	}
	src := t.TempDir()
	must(t, fill(filepath.Join(src, "big"), 24)) // more than the limit below
	must(t, p.ImportTemplate(ctx, "t", src))
	full, err := p.CreateVolume(ctx, "full", "t")
	must(t, err)
	next, err := p.CreateVolume(ctx, "next", "t")
	must(t, err)
	const limit = 16 * mib
	must(t, p.SetLimit(ctx, "full", limit, base))

	commit(t, full)
	if used, l := use(t, p, "full"); used > mib || l != limit {
		t.Errorf("new volume: used %d, limit %d; want under 1 MiB (the template's 24 MiB not counted) and %d", used, l, limit)
	}

	err = fill(filepath.Join(full, "f"), 32)
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("writing 32 MiB into a volume limited to 16 MiB: %v, want EDQUOT", err)
	}
	commit(t, full)
	if used, _ := use(t, p, "full"); used < limit-mib || used > limit {
		t.Errorf("full volume uses %d bytes, want about its limit %d", used, limit)
	}

	// The quota's live counters, which a sandbox's statfs shows: the
	// template counted, in what the volume refers to and in its limit.
	dir, err := p.QuotaDir(ctx, "full")
	must(t, err)
	for name, want := range map[string]int64{"max_referenced": limit + 24*mib, "referenced": limit + 24*mib} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		must(t, err)
		n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		must(t, err)
		if n < want-mib || n > want+mib {
			t.Errorf("%s/%s = %d, want about %d", dir, name, n, want)
		}
	}
	if _, err := p.QuotaDir(ctx, "missing"); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("QuotaDir of a missing volume: %v, want ErrNotFound", err)
	}

	// The neighbour, with no limit, writes more than the full one could.
	must(t, fill(filepath.Join(next, "f"), 24))
	commit(t, next)
	if used, l := use(t, p, "next"); used < 24*mib || used > 25*mib || l != 0 {
		t.Errorf("neighbour: used %d, limit %d; want 24 MiB and a bit, and no limit", used, l)
	}

	// A checkpoint of the full volume, and a restore or fork from it: the
	// clone holds what the full volume held, and counts it.
	must(t, p.Snapshot(ctx, "full", "s"))
	clone, err := p.CloneSnapshot(ctx, "s", "clone")
	must(t, err)
	commit(t, clone)
	if used, l := use(t, p, "clone"); used < limit-mib || used > limit || l != limit {
		t.Errorf("clone: used %d, limit %d; want about %d (the snapshot's) and the snapshot's limit", used, l, limit)
	}
	must(t, p.SetLimit(ctx, "clone", limit, base))
	if err := fill(filepath.Join(clone, "g"), 2); !errors.Is(err, syscall.EDQUOT) {
		t.Errorf("writing 2 MiB into a clone of a full volume limited to 16 MiB: %v, want EDQUOT", err)
	}

	// Lifting the limit lets the full volume write again.
	must(t, p.SetLimit(ctx, "full", 0, base))
	must(t, fill(filepath.Join(full, "more"), 4))
	if _, l := use(t, p, "full"); l != 0 {
		t.Errorf("limit after lifting it = %d, want 0", l)
	}

	if err := p.SetLimit(ctx, "missing", limit, base); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("SetLimit of a missing volume: %v, want ErrNotFound", err)
	}
	if _, _, err := p.DiskUse(ctx, "missing", base); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("DiskUse of a missing volume: %v, want ErrNotFound", err)
	}
	if err := p.SetLimit(ctx, "next", limit, disk.Base{Template: "gone"}); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("SetLimit with a missing base: %v, want ErrNotFound", err)
	}
}

// TestBtrfsQuotaRestoreLoop is issue 20's way past a limit, on the pool: a
// volume writes nearly its limit, is snapshotted, replaced by a clone of
// the snapshot (a restore), and the snapshot deleted, again and again.
// Under simple quotas each clone started from nothing used; the limit must
// hold whatever the sequence, and the use must be what the volume holds.
func TestBtrfsQuotaRestoreLoop(t *testing.T) {
	p := newBtrfs(t)
	ctx := t.Context()
	src := t.TempDir()
	must(t, fill(filepath.Join(src, "tpl"), 8))
	must(t, p.ImportTemplate(ctx, "t", src))
	const limit = 32 * mib
	vol, err := p.CreateVolume(ctx, "v", "t")
	must(t, err)
	must(t, p.SetLimit(ctx, "v", limit, base))
	wrote := 0
	for round := range 4 {
		err := fill(filepath.Join(vol, fmt.Sprint("data", round)), 30)
		if err == nil {
			wrote += 30
		} else if !errors.Is(err, syscall.EDQUOT) {
			t.Fatalf("round %d: %v", round, err)
		}
		snap := fmt.Sprint("s", round)
		must(t, p.Snapshot(ctx, "v", snap))
		must(t, p.DeleteVolume(ctx, "v"))
		vol, err = p.CloneSnapshot(ctx, snap, "v")
		must(t, err)
		must(t, p.SetLimit(ctx, "v", limit, base))
		must(t, p.DeleteSnapshot(ctx, snap))
	}
	if wrote != 30 {
		t.Errorf("wrote %d MiB whole in 4 rounds under a %d MiB limit, want 30", wrote, limit/mib)
	}
	commit(t, vol)
	held, err := disk.BlocksUsed(ctx, vol)
	must(t, err)
	used, _ := use(t, p, "v")
	if held > limit+8*mib+mib {
		t.Errorf("the volume holds %d bytes (the template's 8 MiB included), over its limit %d", held, limit)
	}
	if d := used - (held - 8*mib); d < -mib || d > mib {
		t.Errorf("use %d, want what the volume holds beyond its template, %d", used, held-8*mib)
	}
}

// TestBtrfsQuotaSwitch: a pool made with simple quotas (by an older loam)
// is switched to classic qgroups when opened, and says its limits were
// dropped; a clone then counts what it holds.
func TestBtrfsQuotaSwitch(t *testing.T) {
	requireBtrfs(t)
	ctx := t.Context()
	dir := t.TempDir()
	p, err := disk.NewBtrfsWithQuotas(ctx, dir, 1<<30, disk.QuotaSimple)
	must(t, err)
	t.Cleanup(func() {
		if err := p.Destroy(context.Background()); err != nil {
			t.Errorf("destroying pool: %v", err)
		}
	})
	src := t.TempDir()
	must(t, fill(filepath.Join(src, "tpl"), 4))
	must(t, p.ImportTemplate(ctx, "t", src))
	v, err := p.CreateVolume(ctx, "v", "t")
	must(t, err)
	must(t, fill(filepath.Join(v, "data"), 8))
	must(t, p.Snapshot(ctx, "v", "s"))
	_, err = p.CloneSnapshot(ctx, "s", "c")
	must(t, err)
	must(t, p.Unmount(ctx))
	p, err = disk.NewBtrfs(ctx, dir, 1<<30)
	must(t, err)
	if p.Quotas() != "qgroup" || !p.SwitchedQuotas() {
		t.Fatalf("reopened: Quotas() = %q, switched %v; want qgroup, true", p.Quotas(), p.SwitchedQuotas())
	}
	if used, l := use(t, p, "c"); used < 8*mib || used > 9*mib || l != 0 {
		t.Errorf("clone after the switch: used %d, limit %d; want 8 MiB and a bit, no limit", used, l)
	}
}

// TestBtrfsNoQuotas: a pool whose filesystem keeps no quotas says so
// rather than pretending to limit.
func TestBtrfsNoQuotas(t *testing.T) {
	p := newBtrfsQuotas(t, 1<<30, disk.QuotaNone)
	ctx := t.Context()
	if p.Quotas() != "" {
		t.Fatalf("Quotas() = %q with none turned on", p.Quotas())
	}
	must(t, p.ImportTemplate(ctx, "t", t.TempDir()))
	_, err := p.CreateVolume(ctx, "v", "t")
	must(t, err)
	if err := p.SetLimit(ctx, "v", mib, base); !errors.Is(err, disk.ErrNoQuotas) {
		t.Errorf("SetLimit without quotas: %v, want ErrNoQuotas", err)
	}
	if _, _, err := p.DiskUse(ctx, "v", base); !errors.Is(err, disk.ErrNoQuotas) {
		t.Errorf("DiskUse without quotas: %v, want ErrNoQuotas", err)
	}
}

// TestBtrfsQuotaReopen: a pool opened again (a daemon restart) finds its
// quotas on and its limits kept.
func TestBtrfsQuotaReopen(t *testing.T) {
	requireBtrfs(t)
	ctx := t.Context()
	dir := t.TempDir()
	p, err := disk.NewBtrfs(ctx, dir, 1<<30)
	must(t, err)
	t.Cleanup(func() {
		if err := p.Destroy(context.Background()); err != nil {
			t.Errorf("destroying pool: %v", err)
		}
	})
	must(t, p.ImportTemplate(ctx, "t", t.TempDir()))
	_, err = p.CreateVolume(ctx, "v", "t")
	must(t, err)
	must(t, p.SetLimit(ctx, "v", 8*mib, base))
	must(t, p.Unmount(ctx))
	p, err = disk.NewBtrfs(ctx, dir, 1<<30)
	must(t, err)
	if p.Quotas() != "qgroup" || p.SwitchedQuotas() {
		t.Errorf("Quotas() after reopening = %q, switched %v; want qgroup, false", p.Quotas(), p.SwitchedQuotas())
	}
	if _, l := use(t, p, "v"); l != 8*mib {
		t.Errorf("limit after reopening = %d, want %d", l, 8*mib)
	}
}

// TestCopyNoLimiter: the copy pool cannot limit a volume, and says so by
// not being a Limiter, so sandboxes on it report their limit not enforced.
func TestCopyNoLimiter(t *testing.T) {
	if _, ok := disk.Pool(newCopy(t)).(disk.Limiter); ok {
		t.Error("the copy pool is a Limiter")
	}
}
