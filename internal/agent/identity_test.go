package agent

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/testenv"
)

// fullDisk is a small tmpfs of the test's own, which fill fills to ENOSPC
// and free empties again: a sandbox's disk at its quota, as the agent
// meets it.
type fullDisk struct {
	t    *testing.T
	dir  string
	fill string
}

func newFullDisk(t *testing.T) *fullDisk {
	t.Helper()
	testenv.Root(t) // for a tmpfs of the test's own
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=256k,mode=0755"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return &fullDisk{t: t, dir: dir, fill: filepath.Join(dir, "filler")}
}

// fillUp writes until the disk says ENOSPC.
func (d *fullDisk) fillUp() {
	f, err := os.OpenFile(d.fill, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				d.t.Fatalf("filling the disk: %v", err)
			}
			return
		}
	}
}

func (d *fullDisk) free() {
	if err := os.Remove(d.fill); err != nil {
		d.t.Fatal(err)
	}
}

// TestIdentityFullDisk: an agent told its identity on a full disk takes it
// in memory and answers insufficient_storage, never 500, leaving no stale
// file of another identity; told the identity it has (every restart of the
// daemon), it writes nothing and answers 204 on a full disk; a file written
// there is insufficient_storage too.
func TestIdentityFullDisk(t *testing.T) {
	disk := newFullDisk(t)
	h := newHandler(Config{Token: testToken, Logger: testLogger()})
	h.identityDir = filepath.Join(disk.dir, "loam")
	etc := t.TempDir()
	h.passwdPath = writeFile(t, etc, "passwd", "root:x:0:0::/root:/bin/sh\n")
	h.groupPath = writeFile(t, etc, "group", "root:x:0:\n")
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := &Client{BaseURL: srv.URL, Token: testToken}
	ctx := context.Background()
	source := Identity{SandboxID: "sb-source", SandboxName: "source", APIURL: "http://10.0.0.1:1", APIToken: "loam_sb_source"}
	fork := Identity{SandboxID: "sb-fork", SandboxName: "fork", APIURL: "http://10.0.0.2:1", APIToken: "loam_sb_fork"}

	if err := c.SetIdentity(ctx, source); err != nil {
		t.Fatalf("identity on a disk with room: %v", err)
	}
	disk.fillUp()
	// A restart of the daemon tells the agent what it knows.
	if err := c.SetIdentity(ctx, source); err != nil {
		t.Errorf("the same identity again on a full disk: %v, want it taken (nothing to write)", err)
	}
	// A fork wakes up with its source's files and is told its own.
	err := c.SetIdentity(ctx, fork)
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != http.StatusInsufficientStorage || ae.Code != string(api.CodeInsufficientStorage) {
		t.Fatalf("a new identity on a full disk: %v, want 507 insufficient_storage", err)
	}
	if !IsNoSpace(err) {
		t.Errorf("IsNoSpace(%v) = false", err)
	}
	if id := h.identity.Load(); id == nil || id.SandboxID != fork.SandboxID {
		t.Errorf("identity in memory after the full disk: %+v, want the fork's", id)
	}
	for _, name := range []string{"sandbox", "sandbox_name", "token", "api_url"} {
		b, err := os.ReadFile(filepath.Join(h.identityDir, name))
		if err == nil && !strings.Contains(string(b), "fork") {
			t.Errorf("%s after the full disk holds %q: the source's identity is left for the fork's programs", name, b)
		}
	}
	disk.fillUp() // the stale files removed made room
	_, err = c.WriteFile(ctx, FileQuery{Path: filepath.Join(disk.dir, "new"), User: "root"}, "", strings.NewReader("data"), 4)
	if agentStatus(err) != http.StatusInsufficientStorage {
		t.Errorf("a file written on a full disk: %v, want 507", err)
	}

	disk.free()
	if err := c.SetIdentity(ctx, fork); err != nil {
		t.Fatalf("identity with room again: %v", err)
	}
	for name, want := range map[string]string{"sandbox": "sb-fork\n", "token": "loam_sb_fork\n"} {
		if b, err := os.ReadFile(filepath.Join(h.identityDir, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(h.identityDir, "*.loam-tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestIdentityWriterFollowsNoLink: the identity writer follows no link a
// sandbox planted, neither on the way to its directory nor where it writes
// its temporary file, and replaces a link in its file's place rather than
// writing through it.
func TestIdentityWriterFollowsNoLink(t *testing.T) {
	tmp := t.TempDir()
	outside := filepath.Join(tmp, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := Identity{SandboxID: "sb", SandboxName: "n", APIURL: "http://10.0.0.1:1", APIToken: "tok"}

	t.Run("link on the way", func(t *testing.T) {
		// In a directory the sandbox's user may write (its own).
		users := filepath.Join(tmp, "users")
		if err := os.Mkdir(users, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(users, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(users, "linked")
		if err := os.Symlink(outside, link); err != nil {
			t.Fatal(err)
		}
		err := writeIdentity(filepath.Join(link, "loam"), id)
		if !errors.Is(err, unix.ENOTDIR) {
			t.Errorf("identity dir under a link: %v, want ENOTDIR", err)
		}
		if _, err := os.Stat(filepath.Join(outside, "loam")); err == nil {
			t.Error("the identity dir was made through the link")
		}
	})
	t.Run("root's link in root's dir is followed", func(t *testing.T) {
		// As Debian's /var/run -> /run: only root can have made it.
		roots := filepath.Join(tmp, "roots")
		if err := os.Mkdir(roots, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../outside", filepath.Join(roots, "run")); err != nil {
			t.Fatal(err)
		}
		if err := writeIdentity(filepath.Join(roots, "run", "ids"), id); err != nil {
			t.Fatalf("through root's link: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(outside, "ids", "sandbox")); err != nil || string(b) != "sb\n" {
			t.Errorf("sandbox through root's link: %q, %v", b, err)
		}
	})
	t.Run("links in the dir", func(t *testing.T) {
		dir := filepath.Join(tmp, "loam")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, filepath.Join(dir, "sandbox")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, filepath.Join(dir, "token.loam-tmp")); err != nil {
			t.Fatal(err)
		}
		if err := writeIdentity(dir, id); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(victim); !bytes.Equal(b, []byte("kept\n")) {
			t.Errorf("the link's target was written: %q", b)
		}
		fi, err := os.Lstat(filepath.Join(dir, "sandbox"))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("sandbox after the write: %v, %v; want a regular file in the link's place", fi, err)
		}
	})
}

// TestIdentitySocketAfterFullDisk: a disk with no inode left for the API
// socket fails its start as a full disk (507), and the next identity, with
// room again, starts it: a start that failed is not given up for good.
func TestIdentitySocketAfterFullDisk(t *testing.T) {
	disk := newFullDisk(t)
	h := newHandler(Config{Token: testToken, Logger: testLogger()})
	h.identityDir = filepath.Join(disk.dir, "loam")
	if err := os.Mkdir(h.identityDir, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := &Client{BaseURL: srv.URL, Token: testToken}
	ctx := context.Background()
	id := Identity{SandboxID: "sb", SandboxName: "n", APIURL: "http://10.0.0.1:1", APIToken: "tok"}

	// Every inode taken: a tmpfs says ENOSPC, as a full disk does.
	fillers := filepath.Join(disk.dir, "inodes")
	if err := os.Mkdir(fillers, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", disk.dir, "", unix.MS_REMOUNT, "size=256k,nr_inodes=64"); err != nil {
		t.Fatalf("limiting the inodes: %v", err)
	}
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(fillers, strconv.Itoa(i)))
		if err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
		f.Close()
	}
	if err := c.SetIdentity(ctx, id); !IsNoSpace(err) {
		t.Fatalf("identity with no inode left: %v, want 507", err)
	}
	if err := os.RemoveAll(fillers); err != nil {
		t.Fatal(err)
	}
	if err := c.SetIdentity(ctx, id); err != nil {
		t.Fatalf("identity with room again: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(h.identityDir, APISocketName)); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("the API socket after room was made: %v, %v; want it served", fi, err)
	}
}
