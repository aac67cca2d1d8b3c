package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/test/harness"
)

// smallFS makes a btrfs filesystem of sizeMiB on a sparse file, attached to
// a loop device and mounted at a temp dir, with quotas on (classic ones: this btrfs-progs has no --simple; so that
// sandboxes' disk limits work as on the daemon's own pool). It is
// unmounted, detached and removed when the test ends, also when it fails.
// Register it before the daemon that uses it: cleanups run last first.
func smallFS(t *testing.T, sizeMiB int64) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "loam-e2e-smallfs-")
	if err != nil {
		t.Fatal(err)
	}
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	t.Cleanup(func() {
		// Lazily, whatever a failed test left mounted below it first.
		harness.UnmountUnder(mnt)
		if err := exec.Command("umount", mnt).Run(); err != nil {
			exec.Command("umount", "-l", mnt).Run()
		}
		if out, err := exec.Command("losetup", "-j", img).Output(); err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				if dev, _, ok := strings.Cut(line, ":"); ok {
					exec.Command("losetup", "-d", dev).Run()
				}
			}
		}
		os.RemoveAll(dir)
	})
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(sizeMiB << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, c := range [][]string{
		{"mkfs.btrfs", "-q", img},
		{"mount", "-o", "loop", img, mnt},
		{"btrfs", "quota", "enable", mnt},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	return mnt
}

// startDaemonOn runs a daemon whose data dir is dataDir, made by the test.
func startDaemonOn(t *testing.T, dataDir string, extra ...string) *harness.Daemon {
	t.Helper()
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	d := &harness.Daemon{T: t, DataDir: dataDir, Subnet: harness.NextSubnet()}
	d.Start(extra...)
	t.Cleanup(func() { d.Destroy() })
	return d
}

// freeBytes is what statfs says is free on dir's filesystem.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// filler takes up a filesystem's space with one file, to leave a given
// amount free, and gives it all back.
type filler struct {
	t    *testing.T
	dir  string // where free space is measured
	path string
}

// leave grows or shrinks the filler until about free bytes are left on the
// filesystem (btrfs answers statfs in whole chunks of reservations: a few
// rounds get close).
func (f *filler) leave(free int64) {
	f.t.Helper()
	file, err := os.OpenFile(f.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		f.t.Fatal(err)
	}
	defer file.Close()
	// btrfs's free space moves in steps as it allocates chunks, so one
	// fallocate rarely lands on the mark: try again, and say so when it
	// never does rather than let a test go on with the wrong free space.
	var now int64
	for range 32 {
		st, err := file.Stat()
		if err != nil {
			f.t.Fatal(err)
		}
		now = freeBytes(f.t, f.dir)
		diff := now - free
		if diff > -(4<<20) && diff < 4<<20 {
			return
		}
		size := max(st.Size()+diff, 0)
		if diff < 0 {
			if err := file.Truncate(size); err != nil {
				f.t.Fatal(err)
			}
		} else if err := unix.Fallocate(int(file.Fd()), 0, 0, size); err != nil && !errors.Is(err, unix.ENOSPC) {
			f.t.Fatal(err)
		}
		// btrfs gives freed space back at its next commit.
		_ = unix.Syncfs(int(file.Fd()))
	}
	f.t.Fatalf("filling %s: %d bytes free, want %d", f.dir, now, free)
}

// leaveWhen waits for a file matching pattern to appear (work under way),
// then leaves free bytes free, and says on done whether it did.
func (f *filler) leaveWhen(pattern string, free int64, done chan<- error) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			f.leave(free)
			done <- nil
			return
		}
		time.Sleep(time.Millisecond)
	}
	done <- fmt.Errorf("nothing matched %s", pattern)
}

// free removes the filler.
func (f *filler) free() {
	f.t.Helper()
	if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		f.t.Fatal(err)
	}
	if d, err := os.Open(f.dir); err == nil {
		_ = unix.Syncfs(int(d.Fd()))
		d.Close()
	}
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// wantStorage checks that err is insufficient_storage saying what (a
// substring of its message).
func wantStorage(t *testing.T, what string, err error, says string) {
	t.Helper()
	if !errors.Is(err, api.ErrInsufficientStorage) {
		t.Fatalf("%s with the data dir full: %v, want insufficient_storage", what, err)
	}
	if !strings.Contains(err.Error(), says) {
		t.Errorf("%s: %q does not say %q", what, err, says)
	}
	t.Logf("%s: %v", what, err)
}

// TestDataDirFull fills the daemon's data dir (a 3 GiB btrfs filesystem
// made here) during a memory checkpoint (refused up front, and cut short
// midway), a fork, file uploads and an image pull: each fails with
// insufficient_storage, the sandbox runs on, nothing partial is left and
// the store holds no record of it; once space is freed each works.
func TestDataDirFull(t *testing.T) {
	t.Parallel()
	mnt := smallFS(t, 3<<10)
	data := filepath.Join(mnt, "data")
	d := startDaemonOn(t, data, "--template-cache", filepath.Join(mnt, "templates"))
	ctx := harness.Ctx(t)
	fill := &filler{t: t, dir: mnt, path: filepath.Join(mnt, "filler")}
	t.Cleanup(fill.free)

	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "full"})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("full", "sh", "-c", "echo before > /home/loam/mark")
	cpDir := filepath.Join(data, "checkpoints", sb.ID)
	// runs checks that the sandbox answers and kept its file.
	runs := func(when string) {
		t.Helper()
		if out := d.Run("full", "cat", "/home/loam/mark"); strings.TrimSpace(out) != "before" {
			t.Errorf("%s: /home/loam/mark is %q", when, out)
		}
		got, err := d.C.GetSandbox(ctx, "full")
		if err != nil || got.State != api.StateRunning {
			t.Errorf("%s: sandbox %+v, %v; want running", when, got, err)
		}
	}
	// clean checks that no checkpoint of the sandbox is listed, and that
	// no image directory, kept or partial, is left for it.
	clean := func(when string, want int) {
		t.Helper()
		cps, err := d.C.ListCheckpoints(ctx, "full")
		if err != nil || len(cps) != want {
			t.Errorf("%s: checkpoints %+v, %v; want %d", when, cps, err, want)
		}
		ents, _ := os.ReadDir(cpDir)
		if len(ents) != want {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s: %s holds %v; want %d entries", when, cpDir, names, want)
		}
	}

	// A memory checkpoint the free space cannot hold is refused up front.
	fill.leave(80 << 20)
	start := time.Now()
	_, err = d.C.CreateCheckpoint(ctx, "full", api.CreateCheckpoint{})
	wantStorage(t, "memory checkpoint, refused", err, "not enough space in the data dir for a memory checkpoint of")
	t.Logf("refused in %v", time.Since(start).Round(time.Millisecond))
	// On the wire: HTTP 507 and the API's error body.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL+"/v1/sandboxes/full/checkpoints", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body api.ErrorBody
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInsufficientStorage || body.Error == nil || body.Error.Code != api.CodeInsufficientStorage {
		t.Errorf("POST checkpoints with the data dir full: %d %+v; want 507 insufficient_storage", resp.StatusCode, body.Error)
	}
	runs("after the refused checkpoint")
	clean("after the refused checkpoint", 0)
	// A sleep writes the same image: refused too, before any pause.
	_, err = d.C.Sleep(ctx, "full")
	wantStorage(t, "sleep, refused", err, "not enough space in the data dir for a sleep image of")
	runs("after the refused sleep")

	// One the estimate lets through, but that runs out of space while
	// runsc writes the image: the filler takes the space as soon as the
	// checkpoint's temp directory appears.
	fill.free()
	took := make(chan error, 1)
	go fill.leaveWhen(filepath.Join(cpDir, ".tmp-*"), 1<<20, took)
	_, err = d.C.CreateCheckpoint(ctx, "full", api.CreateCheckpoint{})
	if ferr := <-took; ferr != nil {
		t.Fatal(ferr)
	}
	wantStorage(t, "memory checkpoint, midway", err, "ran out of space during a memory checkpoint")
	runs("after the checkpoint cut short")
	clean("after the checkpoint cut short", 0)
	fill.free()
	cp, err := d.C.CreateCheckpoint(ctx, "full", api.CreateCheckpoint{})
	if err != nil {
		t.Fatalf("memory checkpoint with space freed: %v", err)
	}
	clean("after the checkpoint", 1)
	if out, err := exec.Command("du", "-sm", filepath.Join(cpDir, cp.ID, "mem")).Output(); err == nil {
		t.Logf("the memory image takes %s MiB on disk", strings.Fields(string(out))[0])
	}
	// A restore keeps the current state as a memory checkpoint first:
	// refused when that cannot fit, the sandbox left as it was.
	fill.leave(80 << 20)
	_, err = d.C.RestoreCheckpoint(ctx, "full", cp.ID)
	wantStorage(t, "restore, refused", err, "not enough space in the data dir for a memory checkpoint of")
	runs("after the refused restore")
	clean("after the refused restore", 1)
	// One that runs out of space while it keeps the current state: the
	// sandbox runs on as it was, the restore not made. (With room for
	// less than twice the estimate the automatic checkpoint pauses and
	// resumes rather than stops the sandbox, which survives this.)
	fill.leave(115 << 20)
	go fill.leaveWhen(filepath.Join(cpDir, ".tmp-*"), 1<<20, took)
	_, err = d.C.RestoreCheckpoint(ctx, "full", cp.ID)
	if ferr := <-took; ferr != nil {
		t.Fatal(ferr)
	}
	wantStorage(t, "restore, midway", err, "ran out of space")
	runs("after the restore cut short")
	clean("after the restore cut short", 1)
	fill.free()
	// With room enough, the automatic checkpoint stops the sandbox (no
	// pause, no resume); a disk filled by someone else part-way then ends
	// it (gVisor's save), and its state must say so. A restore brings it
	// back.
	go fill.leaveWhen(filepath.Join(cpDir, ".tmp-*"), 1<<20, took)
	_, err = d.C.RestoreCheckpoint(ctx, "full", cp.ID)
	if ferr := <-took; ferr != nil {
		t.Fatal(ferr)
	}
	wantStorage(t, "restore stopping the sandbox, midway", err, "ran out of space")
	fill.free()
	if got, err := d.C.GetSandbox(ctx, "full"); err != nil {
		t.Fatal(err)
	} else if got.State == api.StateRunning {
		runs("after the stopping restore cut short")
	} else {
		t.Logf("after the stopping restore cut short the sandbox is %s", got.State)
		if got.State != api.StateError {
			t.Errorf("after the stopping restore cut short the sandbox is %s; want running or error", got.State)
		}
		if _, err := d.C.RestoreCheckpoint(ctx, "full", cp.ID); err != nil {
			t.Fatalf("restoring with space freed: %v", err)
		}
		runs("restored with space freed")
	}

	// A fork with the data dir at its reserve is refused before any
	// record; with space, it works.
	fill.leave(32 << 20)
	_, err = d.C.Fork(ctx, "full", cp.ID, "fork")
	wantStorage(t, "fork", err, "not enough space in the data dir for a fork")
	if _, err := d.C.GetSandbox(ctx, "fork"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("the refused fork: %v, want not_found", err)
	}
	if vols, _ := os.ReadDir(filepath.Join(data, "disk", "volumes")); len(vols) != 1 {
		t.Errorf("volumes after the refused fork: %d, want 1 (the sandbox's)", len(vols))
	}
	runs("after the refused fork")
	fill.free()
	if _, err := d.C.Fork(ctx, "full", cp.ID, "fork"); err != nil {
		t.Fatalf("fork with space freed: %v", err)
	}
	if out := d.Run("fork", "cat", "/home/loam/mark"); strings.TrimSpace(out) != "before" {
		t.Errorf("fork's /home/loam/mark: %q", out)
	}
	if err := d.C.DeleteSandbox(ctx, "fork"); err != nil {
		t.Fatal(err)
	}

	// Uploads: one of known size the host cannot hold is refused up
	// front; one of unknown size with the host at its reserve too. No
	// partial file is left in the sandbox.
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, 64<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	fill.leave(100 << 20)
	bf, err := os.Open(big)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.C.WriteFile(ctx, "full", "/home/loam/big", bf, nil)
	bf.Close()
	wantStorage(t, "upload of 64 MiB", err, "not enough space in the data dir for an upload of 64 MiB")
	fill.leave(32 << 20)
	_, err = d.C.WriteFile(ctx, "full", "/home/loam/small", strings.NewReader("x"), nil)
	wantStorage(t, "small upload, the host at its reserve", err, "kept in reserve")
	if out := d.Run("full", "ls", "-a", "/home/loam"); strings.Contains(out, "big") || strings.Contains(out, "small") || strings.Contains(out, "loam-") {
		t.Errorf("/root after the refused uploads:\n%s", out)
	}
	// One of unknown size that the reserve lets in, but that fills the
	// host part-way: the sandbox sees "no space" as it would for its own
	// disk; the daemon, finding the host out of room, says so.
	fill.leave(100 << 20)
	_, err = d.C.WriteFile(ctx, "full", "/home/loam/midway", io.LimitReader(zeros{}, 256<<20), nil)
	wantStorage(t, "upload filling the host midway", err, "ran out of space during an upload to /home/loam/midway")
	if out := d.Run("full", "ls", "-a", "/home/loam"); strings.Contains(out, "big") || strings.Contains(out, "small") || strings.Contains(out, "midway") || strings.Contains(out, "loam-") {
		t.Errorf("/home/loam after the refused uploads:\n%s", out)
	}
	runs("after the refused uploads")
	fill.free()
	if bf, err = os.Open(big); err != nil {
		t.Fatal(err)
	}
	_, err = d.C.WriteFile(ctx, "full", "/home/loam/big", bf, nil)
	bf.Close()
	if err != nil {
		t.Fatalf("upload with space freed: %v", err)
	}

	// The sandbox's own disk full: insufficient_storage saying so, the
	// host having room. disk_mib is the least a sandbox may have.
	own, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "own", Resources: &api.Resources{DiskMiB: 256}})
	if err != nil {
		t.Fatal(err)
	}
	_ = own
	huge := filepath.Join(t.TempDir(), "huge")
	if err := os.WriteFile(huge, make([]byte, 300<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	hf, err := os.Open(huge)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.C.WriteFile(ctx, "own", "/home/loam/huge", hf, nil)
	hf.Close()
	if !errors.Is(err, api.ErrInsufficientStorage) || !strings.Contains(err.Error(), "the sandbox's disk is full") {
		t.Errorf("upload beyond the sandbox's own disk limit: %v, want insufficient_storage saying the sandbox's disk is full", err)
	} else {
		t.Logf("upload beyond the sandbox's own disk: %v", err)
	}
	if out := d.Run("own", "ls", "-a", "/home/loam"); strings.Contains(out, "huge") {
		t.Errorf("/root of own after the failed upload:\n%s", out)
	}

	// An image pull: refused at once with the data dir at its reserve;
	// with room for what the manifest says, but not for what the layers
	// unpack to (zeros compress to nothing), the unpacking refuses the
	// file that would take it past the free space before writing it, and
	// leaves no partial template; with space, the same pull works.
	reg := imagetest.Registry(t, "", "")
	ref := reg + "/zeros:v1"
	imagetest.Push(t, ref, imagetest.Image(t, imagetest.BusyboxConfig, imagetest.Busybox(t),
		imagetest.Layer(t, imagetest.Entry{Name: "srv/zeros", Body: make([]byte, 320<<20)})), "", "")
	fill.leave(32 << 20)
	_, err = d.C.PullImage(ctx, ref)
	wantStorage(t, "image pull, refused", err, "not enough space in the data dir for an image pull")
	fill.leave(160 << 20)
	_, err = d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "img", Image: ref})
	wantStorage(t, "create from an image that cannot unpack", err, "not enough space in the data dir to unpack the image")
	im, err := d.C.GetImage(ctx, image.ID(ref))
	if err != nil || im.State != api.ImageError || !strings.Contains(im.Error, "insufficient_storage") {
		t.Errorf("image after the failed pull: %+v, %v; want state error, insufficient_storage", im, err)
	}
	if _, err := d.C.GetSandbox(ctx, "img"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("the sandbox of the failed pull: %v, want not_found", err)
	}
	for _, dir := range []string{filepath.Join(mnt, "templates", "images"), filepath.Join(data, "disk", "tmp")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.Contains(e.Name(), "building") || strings.HasPrefix(e.Name(), "template") {
				t.Errorf("partial template left: %s/%s", dir, e.Name())
			}
		}
	}
	runs("after the failed pull")
	fill.free()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "img", Image: ref}); err != nil {
		t.Fatalf("create from the image with space freed: %v", err)
	}
	if out := d.Run("img", "stat", "-c", "%s", "/srv/zeros"); strings.TrimSpace(out) != fmt.Sprint(320<<20) {
		t.Errorf("/srv/zeros in the image's sandbox: %q", out)
	}
	runs("at the end")
}
