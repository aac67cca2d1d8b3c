package disk_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/testenv"
)

// The volume TestWalkStaysInVolume attacks, and another one whose files it
// tries to reach from there.
const (
	escapeDirs    = 16      // directories of the attacked volume swapped for links
	escapeMarkers = 20      // files outside, found by their names
	escapeBig     = 8 << 20 // a file outside that Usage would count
	escapeRun     = time.Second / 2
	markerPrefix  = "MARKER-" // names of the files outside
)

// TestWalkStaysInVolume is a sandbox attacking the host's walks of its
// volume: it swaps directories of its volume for symlinks to a directory
// outside it (another sandbox's files) and back, in a tight loop, while the
// host snapshots and measures the volume. A walk that opens paths by name
// follows such a link with root's rights: `cp -a` copied the other files
// into the snapshot, and filepath.WalkDir and `btrfs filesystem du` counted
// them. Snapshot may fail while a directory changes under it; it must never
// copy what is outside.
func TestWalkStaysInVolume(t *testing.T) {
	testenv.Root(t)
	pools := []struct {
		name string
		new  func(t *testing.T) disk.Pool
	}{
		{disk.KindCopy, func(t *testing.T) disk.Pool { return newCopy(t) }},
		{disk.KindBtrfs, func(t *testing.T) disk.Pool {
			requireBtrfs(t)
			return newBtrfs(t)
		}},
	}
	for _, pc := range pools {
		t.Run(pc.name, func(t *testing.T) {
			t.Run("Snapshot", func(t *testing.T) { testSnapshotStaysInVolume(t, pc.new(t)) })
			t.Run("Usage", func(t *testing.T) { testUsageStaysInVolume(t, pc.new(t)) })
		})
	}
}

func testSnapshotStaysInVolume(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	v := escapeSetup(t, p)
	stop := swapDirs(t, v, filepath.Join(p.VolumePath("victim"), "secret"))
	var ok, failed int
	for i := 0; i < 10 || ok < 5 || stop.elapsed() < escapeRun; i++ {
		if stop.elapsed() > 20*escapeRun {
			// Only snapshots that succeed can show a leak.
			t.Fatalf("%d of %d snapshots succeeded in %v, too few to prove anything", ok, i, stop.elapsed())
		}
		snap := fmt.Sprint("s", i)
		if err := p.Snapshot(ctx, "v", snap); err != nil {
			// Refusing a directory that turned into a link is right.
			if failed++; failed <= 3 {
				t.Logf("snapshot %d: %v", i, err)
			}
			continue
		}
		ok++
		if leaked := markersIn(t, snapshotPath(p, snap)); len(leaked) > 0 {
			stop.now()
			t.Fatalf("snapshot %d holds %d files from outside the volume, e.g. %s", i, len(leaked), leaked[0])
		}
		must(t, p.DeleteSnapshot(ctx, snap))
	}
	stop.now()
	t.Logf("%d snapshots taken, %d refused, %d swaps", ok, failed, stop.swaps)
}

func testUsageStaysInVolume(t *testing.T, p disk.Pool) {
	ctx := t.Context()
	v := escapeSetup(t, p)
	base, err := p.Usage(ctx, "v")
	must(t, err)
	stop := swapDirs(t, v, filepath.Join(p.VolumePath("victim"), "secret"))
	n := 0
	for ; n < 20 || stop.elapsed() < escapeRun; n++ {
		got, err := p.Usage(ctx, "v")
		if err != nil {
			// A measurement must not be something the sandbox can
			// break by renaming its own files.
			stop.now()
			t.Fatalf("Usage %d while the volume changes: %v", n, err)
		}
		if got-base > escapeBig/2 {
			stop.now()
			t.Fatalf("Usage %d = %d, %d before the race: it counted the %d-byte file outside the volume", n, got, base, escapeBig)
		}
	}
	stop.now()
	t.Logf("%d measurements, %d swaps", n, stop.swaps)
}

// escapeSetup makes volume "v", with escapeDirs directories of a few files
// each, and volume "victim" with files in victim/secret, the markers and
// one big file; it returns v's root.
func escapeSetup(t *testing.T, p disk.Pool) string {
	t.Helper()
	ctx := t.Context()
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("template\n"), 0o644))
	must(t, p.ImportTemplate(ctx, "t", src))
	v, err := p.CreateVolume(ctx, "v", "t")
	must(t, err)
	victim, err := p.CreateVolume(ctx, "victim", "t")
	must(t, err)

	secret := filepath.Join(victim, "secret")
	must(t, os.Mkdir(secret, 0o755))
	for i := range escapeMarkers {
		must(t, os.WriteFile(filepath.Join(secret, fmt.Sprint(markerPrefix, i)), []byte("outside\n"), 0o644))
	}
	big := make([]byte, escapeBig)
	_, _ = rand.Read(big) // incompressible, in case the filesystem compresses
	f, err := os.Create(filepath.Join(secret, markerPrefix+"big"))
	must(t, err)
	_, err = f.Write(big)
	must(t, err)
	must(t, f.Sync()) // btrfs counts extents, allocated at flush time
	must(t, f.Close())

	for i := range escapeDirs {
		d := filepath.Join(v, fmt.Sprint("d", i))
		must(t, os.Mkdir(d, 0o755))
		for j := range 4 {
			must(t, os.WriteFile(filepath.Join(d, fmt.Sprint("inside-", j)), []byte("inside\n"), 0o644))
		}
	}
	return v
}

// snapshotPath is where both pools keep snapshot snap: snapshots/ next to
// volumes/. Reading it there rather than through a clone halves the time
// each round of the race takes.
func snapshotPath(p disk.Pool, snap string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(p.VolumePath("x"))), "snapshots", snap)
}

// swapper is the attacking sandbox's loop.
type swapper struct {
	start time.Time
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	swaps int // read after now
}

// swapDirs starts swapping each directory d<i> of root for a symlink to
// target and back until stop.now or the end of the test. Each swap is one
// rename(2) exchanging the directory with a symlink l<i> beside it, so the
// name is always there and flips as often as the machine allows.
func swapDirs(t *testing.T, root, target string) *swapper {
	s := &swapper{start: time.Now(), done: make(chan struct{})}
	dirfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	for i := range escapeDirs {
		must(t, unix.Symlinkat(target, dirfd, fmt.Sprint("l", i)))
	}
	s.wg.Go(func() {
		defer unix.Close(dirfd)
		for {
			select {
			case <-s.done:
				return
			default:
			}
			for i := range escapeDirs {
				d, l := fmt.Sprint("d", i), fmt.Sprint("l", i)
				if err := unix.Renameat2(dirfd, d, dirfd, l, unix.RENAME_EXCHANGE); err != nil {
					t.Errorf("swapping %s and %s: %v", d, l, err)
					return
				}
			}
			s.swaps++
		}
	})
	t.Cleanup(s.now)
	return s
}

func (s *swapper) elapsed() time.Duration { return time.Since(s.start) }

// now stops the loop and waits for it.
func (s *swapper) now() {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
}

// markersIn lists the files under root named like the ones outside,
// without following links.
func markersIn(t *testing.T, root string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), markerPrefix) {
			found = append(found, path)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return found
}
