package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/testenv"
)

// TestFullFilesystem runs the store on a btrfs filesystem filled to the last
// block, as the data dir is when a sandbox or a pull fills it. Reads must go
// on working, writes must fail as insufficient_storage and lose nothing, and
// once space is freed writes must work again. It runs in a child process so
// that a fatal signal (a store into a memory-mapped file the filesystem has
// no room for is answered with SIGBUS on btrfs) fails the test instead of
// killing the test binary before it unmounts.
//
// With the WAL index in a mapped -shm file every read here failed with
// SQLITE_IOERR_IN_PAGE, and a CI run of the daemon died of such a fault.
func TestFullFilesystem(t *testing.T) {
	if dir := os.Getenv("LOAM_STORE_FULL_DIR"); dir != "" {
		fullHelper(dir)
		return
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to mount a btrfs filesystem")
	}
	for _, tool := range []string{"mkfs.btrfs", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "needs %s: %v", tool, err)
		}
	}
	mnt := smallBtrfs(t, 256<<20)
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestFullFilesystem$", "-test.v")
	cmd.Env = append(os.Environ(), "LOAM_STORE_FULL_DIR="+mnt)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v; output:\n%s", err, out)
	}
	t.Logf("helper:\n%s", out)
}

// fullHelper is the child of TestFullFilesystem. It reports by its exit
// status and output.
func fullHelper(dir string) {
	if err := fullRun(context.Background(), dir); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func fullRun(ctx context.Context, dir string) error {
	path := filepath.Join(dir, "loam.db")
	s, err := Open(ctx, path)
	if err != nil {
		return err
	}
	const before = 40
	for i := range before {
		if err := s.CreateSandbox(ctx, fullSandbox("a", i)); err != nil {
			return err
		}
	}
	dirFile, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer dirFile.Close()
	filler := filepath.Join(dir, "filler")
	if err := fill(filler); err != nil {
		return err
	}
	var refused int
	for i := range 50 {
		// Writeback cleans the -shm pages a mapping dirtied; the next
		// store into one needs new room on btrfs. sync forces what the
		// kernel does every 30 s.
		syncFS(dirFile)
		list, err := s.ListSandboxes(ctx, store.Filter{})
		if err != nil {
			return fmt.Errorf("read %d on the full filesystem: %w", i, err)
		}
		if len(list) != before+i-refused {
			return fmt.Errorf("read %d on the full filesystem: %d sandboxes, want %d", i, len(list), before+i-refused)
		}
		if _, err := s.GetSandbox(ctx, "", "a-7"); err != nil {
			return fmt.Errorf("get %d on the full filesystem: %w", i, err)
		}
		err = s.CreateSandbox(ctx, fullSandbox("b", i))
		switch {
		case errors.Is(err, api.ErrInsufficientStorage):
			refused++
		case err != nil:
			return fmt.Errorf("write %d on the full filesystem: %v, want insufficient_storage", i, err)
		}
	}
	// A filesystem that took every write was not full: the test would
	// prove nothing.
	if refused == 0 {
		return errors.New("every write on the full filesystem worked; the filler did not fill it")
	}
	fmt.Printf("on the full filesystem: 50 reads worked, %d of 50 writes refused\n", refused)

	if err := os.Remove(filler); err != nil {
		return err
	}
	syncFS(dirFile)
	if err := s.CreateSandbox(ctx, fullSandbox("c", 0)); err != nil {
		return fmt.Errorf("write after space was freed: %w", err)
	}
	if err := s.Close(); err != nil {
		return err
	}
	s, err = Open(ctx, path)
	if err != nil {
		return fmt.Errorf("opening again: %w", err)
	}
	defer s.Close()
	list, err := s.ListSandboxes(ctx, store.Filter{})
	if err != nil {
		return err
	}
	if want := before + 50 - refused + 1; len(list) != want {
		return fmt.Errorf("after opening again: %d sandboxes, want %d", len(list), want)
	}
	return nil
}

func fullSandbox(prefix string, i int) *store.Sandbox {
	return &store.Sandbox{Sandbox: api.Sandbox{
		ID:        fmt.Sprintf("sb-%s%d", prefix, i),
		Name:      fmt.Sprintf("%s-%d", prefix, i),
		CreatedAt: time.Now(),
	}}
}

// fill writes to path until the filesystem refuses, in large then small
// pieces; btrfs frees reservations on sync, so it goes round until a sync
// leaves no room.
func fill(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, size := range []int{1 << 20, 64 << 10, 4 << 10, 512} {
		buf := make([]byte, size)
		for range 5 {
			for {
				if _, err := f.Write(buf); err != nil {
					if !errors.Is(err, syscall.ENOSPC) {
						return err
					}
					break
				}
			}
			syncFS(f)
		}
	}
	return nil
}

// syncFS writes back the filesystem f is on, as the kernel does every 30
// s: syncfs(2), not sync(2), which would flush every filesystem of the
// machine, the one TestPowerLoss needs left unwritten included.
func syncFS(f *os.File) {
	unix.Syncfs(int(f.Fd()))
}

// smallBtrfs mounts a new btrfs filesystem of size bytes (a sparse loop
// image) and returns its mount point, unmounted when the test ends.
func smallBtrfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.btrfs", "-q", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.btrfs: %v: %s", err, out)
	}
	// A loop mount's device is detached when it is unmounted.
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	// Registered after TempDir, so it runs before the directory's removal.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, strings.TrimSpace(string(out)))
			exec.Command("umount", "-l", mnt).Run()
		}
	})
	return mnt
}
