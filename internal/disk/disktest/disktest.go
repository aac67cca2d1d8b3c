// Package disktest is the test suite every disk.Pool implementation must
// pass, so that the btrfs pool and the plain-copy fallback behave the same.
package disktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"loam.dev/loam/internal/disk"
)

// Run runs the suite. newPool returns a new, empty pool for one subtest and
// arranges for its removal with t.Cleanup. Ownership checks run only as
// root.
func Run(t *testing.T, newPool func(t *testing.T) disk.Pool) {
	tests := []struct {
		name string
		fn   func(t *testing.T, p disk.Pool)
	}{
		{"ImportTemplate", testImportTemplate},
		{"ImportTemplateFailure", testImportTemplateFailure},
		{"CreateVolume", testCreateVolume},
		{"VolumesAreIsolated", testVolumesAreIsolated},
		{"SnapshotIsFrozen", testSnapshotIsFrozen},
		{"CloneIsIndependent", testCloneIsIndependent},
		{"SnapshotOutlivesVolume", testSnapshotOutlivesVolume},
		{"RenameVolume", testRenameVolume},
		{"ImportSnapshot", testImportSnapshot},
		{"DeleteIsIdempotent", testDeleteIsIdempotent},
		{"List", testList},
		{"Usage", testUsage},
		{"Concurrent", testConcurrent},
		{"InvalidNames", testInvalidNames},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newPool(t))
		})
	}
}

// The tree imported as template "tmpl" by withTemplate.
const (
	tmplName     = "tmpl"
	tmplContent  = "from the template\n"
	tmplFile     = "etc/hostname"
	tmplScript   = "bin/tool"
	tmplHardlink = "bin/tool-link"
	tmplSymlink  = "link"
	tmplSecret   = "root/secret"
	tmplHome     = "home/loam"
)

// makeTree makes a small root filesystem with the kinds of entries a real
// one has: modes, a symlink, a hard link, a private file, a user's home.
func makeTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	for _, d := range []string{"etc", "bin", "root", tmplHome} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	must(t, os.Chmod(filepath.Join(dir, "root"), 0o700))
	writeFile(t, filepath.Join(dir, tmplFile), tmplContent, 0o644)
	writeFile(t, filepath.Join(dir, tmplScript), "#!/bin/sh\necho hi\n", 0o755)
	writeFile(t, filepath.Join(dir, tmplSecret), "secret\n", 0o600)
	must(t, os.Link(filepath.Join(dir, tmplScript), filepath.Join(dir, tmplHardlink)))
	must(t, os.Symlink(tmplFile, filepath.Join(dir, tmplSymlink)))
	if os.Geteuid() == 0 {
		must(t, os.Chown(filepath.Join(dir, tmplHome), 1000, 1000))
	}
	return dir
}

// withTemplate imports makeTree's tree as template tmplName.
func withTemplate(t *testing.T, p disk.Pool) {
	t.Helper()
	must(t, p.ImportTemplate(t.Context(), tmplName, makeTree(t)))
}

// newVolume makes volume id from tmplName.
func newVolume(t *testing.T, p disk.Pool, id string) string {
	t.Helper()
	root, err := p.CreateVolume(t.Context(), id, tmplName)
	must(t, err)
	return root
}

// checkTree fails unless root holds makeTree's tree as it was made.
func checkTree(t *testing.T, root string) {
	t.Helper()
	if got := readFile(t, filepath.Join(root, tmplFile)); got != tmplContent {
		t.Errorf("%s = %q, want %q", tmplFile, got, tmplContent)
	}
	checkMode(t, filepath.Join(root, tmplScript), 0o755)
	checkMode(t, filepath.Join(root, tmplSecret), 0o600)
	checkMode(t, filepath.Join(root, "root"), os.ModeDir|0o700)
	checkMode(t, root, os.ModeDir|0o755)
	if target, err := os.Readlink(filepath.Join(root, tmplSymlink)); err != nil || target != tmplFile {
		t.Errorf("symlink %s = %q, %v; want %q", tmplSymlink, target, err, tmplFile)
	}
	if a, b := inode(t, filepath.Join(root, tmplScript)), inode(t, filepath.Join(root, tmplHardlink)); a != b {
		t.Errorf("hard link %s has inode %d, %s has %d; want the same", tmplHardlink, b, tmplScript, a)
	}
	if os.Geteuid() == 0 {
		fi, err := os.Stat(filepath.Join(root, tmplHome))
		must(t, err)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s owned by %d:%d, want 1000:1000", tmplHome, st.Uid, st.Gid)
		}
	}
}

func testImportTemplate(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	if ok, err := p.HasTemplate(ctx, tmplName); err != nil || ok {
		t.Fatalf("HasTemplate before import = %v, %v; want false", ok, err)
	}
	src := makeTree(t)
	must(t, p.ImportTemplate(ctx, tmplName, src))
	if ok, err := p.HasTemplate(ctx, tmplName); err != nil || !ok {
		t.Fatalf("HasTemplate after import = %v, %v; want true", ok, err)
	}
	// The template is a copy: changing the source later does not change it.
	writeFile(t, filepath.Join(src, tmplFile), "changed\n", 0o644)
	checkTree(t, newVolume(t, p, "v1"))

	if err := p.ImportTemplate(ctx, tmplName, src); !errors.Is(err, disk.ErrExists) {
		t.Errorf("importing %s again: %v, want ErrExists", tmplName, err)
	}
}

func testImportTemplateFailure(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	missing := filepath.Join(t.TempDir(), "missing")
	if err := p.ImportTemplate(ctx, "broken", missing); err == nil {
		t.Fatal("importing a missing directory succeeded")
	}
	if ok, err := p.HasTemplate(ctx, "broken"); err != nil || ok {
		t.Errorf("HasTemplate after failed import = %v, %v; want false", ok, err)
	}
	// A cancelled import leaves nothing either.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.ImportTemplate(cctx, "cancelled", makeTree(t)); err == nil {
		t.Fatal("import with a cancelled context succeeded")
	}
	if ok, err := p.HasTemplate(ctx, "cancelled"); err != nil || ok {
		t.Errorf("HasTemplate after cancelled import = %v, %v; want false", ok, err)
	}
	// The name is still free for a good import.
	must(t, p.ImportTemplate(ctx, "cancelled", makeTree(t)))
}

func testCreateVolume(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	if _, err := p.CreateVolume(ctx, "v1", tmplName); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("CreateVolume from a missing template: %v, want ErrNotFound", err)
	}
	withTemplate(t, p)
	root := newVolume(t, p, "v1")
	if root != p.VolumePath("v1") {
		t.Errorf("CreateVolume returned %s, VolumePath says %s", root, p.VolumePath("v1"))
	}
	checkTree(t, root)
	// The volume is writable, also where the template has files.
	writeFile(t, filepath.Join(root, "new"), "new\n", 0o644)
	writeFile(t, filepath.Join(root, tmplFile), "mine\n", 0o644)
	entries, err := os.ReadDir(root)
	must(t, err)
	if _, err := p.CreateVolume(ctx, "v1", tmplName); !errors.Is(err, disk.ErrExists) {
		t.Errorf("CreateVolume over an existing volume: %v, want ErrExists", err)
	}
	// The failed create did not touch the existing volume (btrfs would
	// snapshot into an existing directory if asked naively).
	if got := readFile(t, filepath.Join(root, tmplFile)); got != "mine\n" {
		t.Errorf("after failed CreateVolume, %s = %q, want %q", tmplFile, got, "mine\n")
	}
	if after, err := os.ReadDir(root); err != nil || len(after) != len(entries) {
		t.Errorf("after failed CreateVolume, volume has %d entries (%v), want %d", len(after), err, len(entries))
	}
}

func testVolumesAreIsolated(t *testing.T, p disk.Pool) {
	withTemplate(t, p)
	a, b := newVolume(t, p, "a"), newVolume(t, p, "b")
	writeFile(t, filepath.Join(a, "only-a"), "a\n", 0o644)
	writeFile(t, filepath.Join(a, tmplFile), "changed in a\n", 0o644)
	must(t, os.Remove(filepath.Join(a, tmplScript)))

	checkTree(t, b)
	checkMissing(t, filepath.Join(b, "only-a"))
	// The template is unchanged: a volume made after the writes is pristine.
	c := newVolume(t, p, "c")
	checkTree(t, c)
	checkMissing(t, filepath.Join(c, "only-a"))
}

func testSnapshotIsFrozen(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	withTemplate(t, p)
	v := newVolume(t, p, "v")
	writeFile(t, filepath.Join(v, "counter"), "1\n", 0o644)
	must(t, p.Snapshot(ctx, "v", "s1"))
	must(t, p.SyncSnapshot(ctx, "s1"))
	writeFile(t, filepath.Join(v, "counter"), "2\n", 0o644)
	writeFile(t, filepath.Join(v, "later"), "later\n", 0o644)

	c, err := p.CloneSnapshot(ctx, "s1", "c")
	must(t, err)
	if got := readFile(t, filepath.Join(c, "counter")); got != "1\n" {
		t.Errorf("counter in snapshot = %q, want %q", got, "1\n")
	}
	checkMissing(t, filepath.Join(c, "later"))
	checkTree(t, c)
	if got := readFile(t, filepath.Join(v, "counter")); got != "2\n" {
		t.Errorf("counter in volume = %q, want %q", got, "2\n")
	}

	if err := p.Snapshot(ctx, "v", "s1"); !errors.Is(err, disk.ErrExists) {
		t.Errorf("Snapshot to an existing name: %v, want ErrExists", err)
	}
	if err := p.Snapshot(ctx, "missing", "s2"); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("Snapshot of a missing volume: %v, want ErrNotFound", err)
	}
	// The failed snapshot did not change the existing one.
	c2, err := p.CloneSnapshot(ctx, "s1", "c2")
	must(t, err)
	if got := readFile(t, filepath.Join(c2, "counter")); got != "1\n" {
		t.Errorf("counter in snapshot after failed Snapshot = %q, want %q", got, "1\n")
	}
}

func testCloneIsIndependent(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	withTemplate(t, p)
	v := newVolume(t, p, "v")
	writeFile(t, filepath.Join(v, "state"), "snapshotted\n", 0o644)
	must(t, p.Snapshot(ctx, "v", "s"))
	c1, err := p.CloneSnapshot(ctx, "s", "c1")
	must(t, err)
	c2, err := p.CloneSnapshot(ctx, "s", "c2")
	must(t, err)
	if c1 != p.VolumePath("c1") {
		t.Errorf("CloneSnapshot returned %s, VolumePath says %s", c1, p.VolumePath("c1"))
	}

	writeFile(t, filepath.Join(c1, "state"), "c1\n", 0o644)
	writeFile(t, filepath.Join(c1, "only-c1"), "c1\n", 0o644)
	for _, root := range []string{v, c2} {
		if got := readFile(t, filepath.Join(root, "state")); got != "snapshotted\n" {
			t.Errorf("%s: state = %q after writing a clone, want %q", root, got, "snapshotted\n")
		}
		checkMissing(t, filepath.Join(root, "only-c1"))
	}
	// The snapshot itself did not change either.
	c3, err := p.CloneSnapshot(ctx, "s", "c3")
	must(t, err)
	if got := readFile(t, filepath.Join(c3, "state")); got != "snapshotted\n" {
		t.Errorf("snapshot changed by a clone's writes: state = %q", got)
	}

	if _, err := p.CloneSnapshot(ctx, "missing", "c4"); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("CloneSnapshot of a missing snapshot: %v, want ErrNotFound", err)
	}
	if _, err := p.CloneSnapshot(ctx, "s", "c1"); !errors.Is(err, disk.ErrExists) {
		t.Errorf("CloneSnapshot over an existing volume: %v, want ErrExists", err)
	}
}

func testSnapshotOutlivesVolume(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	withTemplate(t, p)
	v := newVolume(t, p, "v")
	writeFile(t, filepath.Join(v, "state"), "kept\n", 0o644)
	must(t, p.Snapshot(ctx, "v", "s"))
	must(t, p.DeleteVolume(ctx, "v"))
	// Restore in place: the same id again, from the snapshot.
	v2, err := p.CloneSnapshot(ctx, "s", "v")
	must(t, err)
	if got := readFile(t, filepath.Join(v2, "state")); got != "kept\n" {
		t.Errorf("state = %q, want %q", got, "kept\n")
	}
	// And a clone outlives its snapshot.
	must(t, p.DeleteSnapshot(ctx, "s"))
	if got := readFile(t, filepath.Join(v2, "state")); got != "kept\n" {
		t.Errorf("after deleting the snapshot, state = %q, want %q", got, "kept\n")
	}
}

// testRenameVolume: a clone prepared under another id takes the place of
// a deleted volume, as a restore in place does, and a rename never
// replaces a volume nor finds one that is not there.
func testRenameVolume(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	withTemplate(t, p)
	v := newVolume(t, p, "v")
	writeFile(t, filepath.Join(v, "state"), "old\n", 0o644)
	must(t, p.Snapshot(ctx, "v", "s"))
	writeFile(t, filepath.Join(v, "state"), "new\n", 0o644)
	staged, err := p.CloneSnapshot(ctx, "s", "v-staged")
	must(t, err)
	if err := p.RenameVolume(ctx, "v-staged", "v"); !errors.Is(err, disk.ErrExists) {
		t.Errorf("RenameVolume over an existing volume: %v, want ErrExists", err)
	}
	if got := readFile(t, filepath.Join(v, "state")); got != "new\n" {
		t.Errorf("a refused rename changed the volume: state = %q", got)
	}
	must(t, p.DeleteVolume(ctx, "v"))
	must(t, p.RenameVolume(ctx, "v-staged", "v"))
	if got := readFile(t, filepath.Join(p.VolumePath("v"), "state")); got != "old\n" {
		t.Errorf("after the rename, state = %q, want %q", got, "old\n")
	}
	checkMissing(t, staged)
	vols, err := p.Volumes(ctx)
	must(t, err)
	if !slices.Equal(vols, []string{"v"}) {
		t.Errorf("volumes after the rename: %v, want [v]", vols)
	}
	// The volume is writable and independent of the snapshot, as a clone.
	writeFile(t, filepath.Join(p.VolumePath("v"), "state"), "again\n", 0o644)
	must(t, p.DeleteVolume(ctx, "v"))
	if err := p.RenameVolume(ctx, "missing", "w"); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("RenameVolume of a missing volume: %v, want ErrNotFound", err)
	}
	if err := p.RenameVolume(ctx, "v", "../x"); err == nil {
		t.Errorf("RenameVolume to an invalid name succeeded")
	}
}

// testImportSnapshot: a tree imported as a snapshot reads as it was at
// SnapshotPath, clones of it are writable and whole, and a second import
// under the same name is refused.
func testImportSnapshot(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	must(t, p.ImportSnapshot(ctx, "tpl.s", makeTree(t)))
	checkTree(t, p.SnapshotPath("tpl.s"))
	v, err := p.CloneSnapshot(ctx, "tpl.s", "v")
	must(t, err)
	checkTree(t, v)
	writeFile(t, filepath.Join(v, tmplFile), "changed\n", 0o644)
	if got := readFile(t, filepath.Join(p.SnapshotPath("tpl.s"), tmplFile)); got != tmplContent {
		t.Errorf("a write to a clone changed the snapshot: %q", got)
	}
	if err := p.ImportSnapshot(ctx, "tpl.s", makeTree(t)); err == nil {
		t.Error("a second ImportSnapshot under the same name succeeded")
	}
	must(t, p.DeleteSnapshot(ctx, "tpl.s"))
	checkMissing(t, p.SnapshotPath("tpl.s"))
}

func testDeleteIsIdempotent(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	withTemplate(t, p)
	v := newVolume(t, p, "v")
	must(t, p.Snapshot(ctx, "v", "s"))
	for range 2 {
		must(t, p.DeleteVolume(ctx, "v"))
		must(t, p.DeleteSnapshot(ctx, "s"))
	}
	checkMissing(t, v)
	must(t, p.DeleteVolume(ctx, "never"))
	must(t, p.DeleteSnapshot(ctx, "never"))
	if _, err := p.CloneSnapshot(ctx, "s", "c"); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("CloneSnapshot of a deleted snapshot: %v, want ErrNotFound", err)
	}
	// The names are free again.
	newVolume(t, p, "v")
	must(t, p.Snapshot(ctx, "v", "s"))
}

func testList(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	check := func(wantVolumes, wantSnapshots []string) {
		t.Helper()
		vols, err := p.Volumes(ctx)
		must(t, err)
		snaps, err := p.Snapshots(ctx)
		must(t, err)
		if !slices.Equal(vols, wantVolumes) {
			t.Errorf("Volumes = %q, want %q", vols, wantVolumes)
		}
		if !slices.Equal(snaps, wantSnapshots) {
			t.Errorf("Snapshots = %q, want %q", snaps, wantSnapshots)
		}
	}
	check(nil, nil)
	withTemplate(t, p)
	check(nil, nil) // templates are neither
	newVolume(t, p, "b")
	newVolume(t, p, "a")
	must(t, p.Snapshot(ctx, "a", "s2"))
	must(t, p.Snapshot(ctx, "b", "s1"))
	_, err := p.CloneSnapshot(ctx, "s1", "c")
	must(t, err)
	check([]string{"a", "b", "c"}, []string{"s1", "s2"})
	must(t, p.DeleteVolume(ctx, "b"))
	must(t, p.DeleteSnapshot(ctx, "s2"))
	check([]string{"a", "c"}, []string{"s1"})
}

func testUsage(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	if _, err := p.Usage(ctx, "missing"); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("Usage of a missing volume: %v, want ErrNotFound", err)
	}
	withTemplate(t, p)
	v := newVolume(t, p, "v")
	before, err := p.Usage(ctx, "v")
	must(t, err)
	const size = 4 << 20
	data := make([]byte, size)
	_, _ = rand.Read(data) // incompressible, in case the filesystem compresses
	f, err := os.Create(filepath.Join(v, "big"))
	must(t, err)
	_, err = f.Write(data)
	must(t, err)
	// Usage counts what reached the disk; btrfs allocates at flush time.
	must(t, f.Sync())
	must(t, f.Close())
	after, err := p.Usage(ctx, "v")
	must(t, err)
	if after-before < size*3/4 {
		t.Errorf("Usage went from %d to %d after writing %d bytes, want it to grow by about that", before, after, size)
	}
}

func testConcurrent(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	withTemplate(t, p)
	const n = 6
	var wg sync.WaitGroup
	errs := make(chan error, 3*n)
	for i := range n {
		// Distinct volumes in parallel, and everyone racing for "same".
		wg.Go(func() {
			_, err := p.CreateVolume(ctx, fmt.Sprintf("v%d", i), tmplName)
			errs <- err
		})
		wg.Go(func() {
			_, err := p.CreateVolume(ctx, "same", tmplName)
			if errors.Is(err, disk.ErrExists) {
				err = nil
			} else if err == nil {
				err = errWon
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	won := 0
	for err := range errs {
		switch {
		case errors.Is(err, errWon):
			won++
		case err != nil:
			t.Error(err)
		}
	}
	if won != 1 {
		t.Errorf("%d concurrent creates of one volume succeeded, want 1", won)
	}
	checkTree(t, p.VolumePath("same"))
	vols, err := p.Volumes(ctx)
	must(t, err)
	if len(vols) != n+1 {
		t.Errorf("Volumes = %q, want %d", vols, n+1)
	}

	// Snapshots of one volume while it is being written: each succeeds.
	v := p.VolumePath("v0")
	done := make(chan struct{})
	var writer sync.WaitGroup
	writer.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			// Files come and go, as a busy sandbox's temporary files do.
			_ = os.WriteFile(filepath.Join(v, fmt.Sprintf("f%d", i%50)), bytes.Repeat([]byte{'x'}, 4096), 0o644)
			_ = os.Remove(filepath.Join(v, fmt.Sprintf("f%d", (i+25)%50)))
		}
	})
	for i := range n {
		wg.Go(func() {
			if err := p.Snapshot(ctx, "v0", fmt.Sprintf("s%d", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	close(done)
	writer.Wait()
	snaps, err := p.Snapshots(ctx)
	must(t, err)
	if len(snaps) != n {
		t.Errorf("Snapshots = %q, want %d", snaps, n)
	}
}

var errWon = errors.New("won")

func testInvalidNames(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	withTemplate(t, p)
	newVolume(t, p, "v")
	for _, bad := range []string{"", ".", "..", "a/b", "../v", ".hidden"} {
		if _, err := p.CreateVolume(ctx, bad, tmplName); err == nil {
			t.Errorf("CreateVolume(%q) succeeded", bad)
		}
		if _, err := p.CreateVolume(ctx, "x", bad); err == nil {
			t.Errorf("CreateVolume from template %q succeeded", bad)
		}
		if err := p.Snapshot(ctx, "v", bad); err == nil {
			t.Errorf("Snapshot(%q) succeeded", bad)
		}
		if err := p.SyncSnapshot(ctx, bad); err == nil {
			t.Errorf("SyncSnapshot(%q) succeeded", bad)
		}
		if err := p.DeleteVolume(ctx, bad); err == nil {
			t.Errorf("DeleteVolume(%q) succeeded", bad)
		}
		if err := p.ImportTemplate(ctx, bad, t.TempDir()); err == nil {
			t.Errorf("ImportTemplate(%q) succeeded", bad)
		}
	}
	// Nothing escaped the pool: the volume is intact.
	checkTree(t, p.VolumePath("v"))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	must(t, os.WriteFile(path, []byte(content), mode))
	must(t, os.Chmod(path, mode)) // WriteFile's mode is subject to the umask
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("reading %s: %v", path, err)
	}
	return string(data)
}

func checkMissing(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: %v, want it missing", path, err)
	}
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	if got := fi.Mode() & (os.ModeType | os.ModePerm | os.ModeSticky); got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Lstat(path)
	must(t, err)
	return fi.Sys().(*syscall.Stat_t).Ino
}
