package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/testenv"
)

// The files tests work in a temp dir of their own only: every path they
// give the agent is under it, and the symlinks they plant point into it.

// testUID is the uid of the test passwd's "loam"; no account is made on the
// host, the kernel needs none.
const testUID = 4242

// newFilesAgent serves an agent whose users are root and loam (testUID),
// and returns a client for it and a temp dir that loam may enter.
func newFilesAgent(t *testing.T) (*Client, string) {
	t.Helper()
	testenv.Root(t)
	etc := t.TempDir()
	h := NewHandler(Config{Token: testToken, Logger: testLogger()}).(*handler)
	h.passwdPath = writeFile(t, etc, "passwd", "root:x:0:0::/root:/bin/sh\nloam:x:4242:4242::/home/loam:/bin/sh\n")
	h.groupPath = writeFile(t, etc, "group", "root:x:0:\nloam:x:4242:\n")
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	// t.TempDir makes both levels 0700, root's: let loam in.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(dir, testUID, testUID); err != nil {
		t.Fatal(err)
	}
	return &Client{BaseURL: srv.URL, Token: testToken}, dir
}

// agentStatus is the status of the *Error err wraps, or 0.
func agentStatus(err error) int {
	var ae *Error
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

func TestFilesRoundTrip(t *testing.T) {
	c, dir := newFilesAgent(t)
	ctx := context.Background()
	p := filepath.Join(dir, "sub", "deeper", "a.txt")

	info, err := c.WriteFile(ctx, FileQuery{Path: p}, "0640", strings.NewReader("hello"), 5)
	if err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if info.Type != api.FileTypeFile || info.Size != 5 || info.Mode != "0640" {
		t.Errorf("WriteFile answered %+v", info)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != testUID || st.Gid != testUID || st.Mode&0o777 != 0o640 {
		t.Errorf("file is %d:%d %o, want %d:%d 640 (written as loam)", st.Uid, st.Gid, st.Mode&0o777, testUID, testUID)
	}
	if err := syscall.Stat(filepath.Dir(p), &st); err != nil || st.Uid != testUID {
		t.Errorf("parent made as uid %d (%v), want %d", st.Uid, err, testUID)
	}

	// A rewrite without a mode keeps the file's.
	if _, err := c.WriteFile(ctx, FileQuery{Path: p}, "", strings.NewReader("hello again"), -1); err != nil {
		t.Fatalf("WriteFile again: %v", err)
	}
	body, size, err := c.ReadFile(ctx, FileQuery{Path: p})
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	b, _ := io.ReadAll(body)
	body.Close()
	if string(b) != "hello again" || size != int64(len(b)) {
		t.Errorf("read %q (size %d)", b, size)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode after rewrite %v, want 0640", fi.Mode().Perm())
	}

	if err := os.Symlink("sub/deeper/a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	list, err := c.Stat(ctx, FileQuery{Path: dir}, 3)
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if len(list.Entries) != 2 || list.Entries[0].Type != api.FileTypeSymlink || list.Entries[0].Target != "sub/deeper/a.txt" ||
		list.Entries[1].Entries[0].Entries[0].Path != p {
		t.Errorf("listing: %+v", list)
	}

	if _, err := c.Mkdir(ctx, api.MkdirRequest{Path: filepath.Join(dir, "m", "n")}); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	moved := filepath.Join(dir, "m", "n", "b.txt")
	if _, err := c.Move(ctx, api.MoveRequest{From: p, To: moved}); err != nil {
		t.Fatalf("Move: %v", err)
	}
	if _, err := os.Stat(moved); err != nil {
		t.Errorf("moved file: %v", err)
	}
	if err := c.Remove(ctx, FileQuery{Path: filepath.Join(dir, "m")}, false); agentStatus(err) != http.StatusConflict {
		t.Errorf("Remove of a full directory: %v, want 409", err)
	}
	if err := c.Remove(ctx, FileQuery{Path: filepath.Join(dir, "m")}, true); err != nil {
		t.Errorf("Remove recursive: %v", err)
	}
	if _, err := os.Stat(moved); !os.IsNotExist(err) {
		t.Errorf("after Remove: %v", err)
	}
}

func TestFilesRefused(t *testing.T) {
	c, dir := newFilesAgent(t)
	ctx := context.Background()
	// A root-only directory and a symlink to it that loam may follow.
	secret := filepath.Join(dir, "rootonly")
	if err := os.Mkdir(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secret, "key"), []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	// A fifo nobody writes: opening it for reading would wait for ever.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		call   func() error
		status int
	}{
		{"relative path", func() error { _, err := c.Stat(ctx, FileQuery{Path: "etc"}, 0); return err }, 400},
		{"NUL", func() error { _, err := c.Stat(ctx, FileQuery{Path: "/a\x00b"}, 0); return err }, 400},
		{"long path", func() error {
			_, err := c.Stat(ctx, FileQuery{Path: "/" + strings.Repeat("a", api.MaxFilePath)}, 0)
			return err
		}, 400},
		{"unknown user", func() error { _, err := c.Stat(ctx, FileQuery{Path: dir, User: "nobody-x"}, 0); return err }, 400},
		{"missing", func() error { _, err := c.Stat(ctx, FileQuery{Path: filepath.Join(dir, "nope")}, 0); return err }, 404},
		{"read a directory", func() error { _, _, err := c.ReadFile(ctx, FileQuery{Path: dir}); return err }, 400},
		{"read a fifo", func() error { _, _, err := c.ReadFile(ctx, FileQuery{Path: filepath.Join(dir, "fifo")}); return err }, 400},
		{"read through a symlink to root's", func() error {
			_, _, err := c.ReadFile(ctx, FileQuery{Path: filepath.Join(dir, "link", "key")})
			return err
		}, 403},
		{"write through a symlink to root's", func() error {
			_, err := c.WriteFile(ctx, FileQuery{Path: filepath.Join(dir, "link", "planted")}, "", strings.NewReader("x"), 1)
			return err
		}, 403},
		{"remove root's", func() error { return c.Remove(ctx, FileQuery{Path: filepath.Join(dir, "link", "key")}, false) }, 403},
		{"remove /", func() error { return c.Remove(ctx, FileQuery{Path: "/"}, false) }, 400},
		{"bad mode", func() error {
			_, err := c.WriteFile(ctx, FileQuery{Path: filepath.Join(dir, "f")}, "999", strings.NewReader("x"), 1)
			return err
		}, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); agentStatus(err) != tt.status {
				t.Errorf("got %v, want status %d", err, tt.status)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(secret, "planted")); !os.IsNotExist(err) {
		t.Errorf("loam planted a file in root's directory: %v", err)
	}
	// root may.
	if _, err := c.WriteFile(ctx, FileQuery{Path: filepath.Join(dir, "link", "planted"), User: "root"}, "", strings.NewReader("x"), 1); err != nil {
		t.Errorf("as root: %v", err)
	}
}

// tarOf makes a tar of entries: name → content, "->target" for a symlink,
// "/" suffix on the name for a directory.
func tarOf(t *testing.T, entries ...[2]string) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e[0], Mode: 0o644, ModTime: time.Now()}
		switch {
		case strings.HasSuffix(e[0], "/"):
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		case strings.HasPrefix(e[1], "->"):
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e[1][2:]
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e[1]))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			tw.Write([]byte(e[1]))
		}
	}
	tw.Close()
	return &buf
}

func TestFilesArchive(t *testing.T) {
	c, dir := newFilesAgent(t)
	ctx := context.Background()
	dst := filepath.Join(dir, "dst")
	if err := c.WriteArchive(ctx, FileQuery{Path: dst}, tarOf(t, [2]string{"d/", ""}, [2]string{"d/f.txt", "data"}, [2]string{"l", "->d/f.txt"})); err != nil {
		t.Fatalf("WriteArchive: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "l")); err != nil || string(b) != "data" {
		t.Fatalf("extracted: %q, %v", b, err)
	}
	rc, err := c.ReadArchive(ctx, FileQuery{Path: dst})
	if err != nil {
		t.Fatalf("ReadArchive: %v", err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
	if got := strings.Join(names, ","); got != "d/,d/f.txt,l" {
		t.Errorf("archive holds %s", got)
	}

	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o777); err != nil {
		t.Fatal(err)
	}
	escapes := map[string]*bytes.Buffer{
		"dot-dot":        tarOf(t, [2]string{"../outside/evil", "x"}),
		"absolute":       tarOf(t, [2]string{"/" + strings.TrimPrefix(outside, "/") + "/evil", "x"}),
		"symlink in tar": tarOf(t, [2]string{"esc", "->" + outside}, [2]string{"esc/evil", "x"}),
	}
	for name, tb := range escapes {
		t.Run(name, func(t *testing.T) {
			err := c.WriteArchive(ctx, FileQuery{Path: filepath.Join(dir, "x-"+name)}, tb)
			if agentStatus(err) != http.StatusBadRequest {
				t.Errorf("got %v, want 400", err)
			}
			if _, err := os.Lstat(filepath.Join(outside, "evil")); !os.IsNotExist(err) {
				t.Errorf("an entry landed outside: %v", err)
			}
		})
	}
}

func TestFilesWatch(t *testing.T) {
	c, dir := newFilesAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	conn, err := c.DialWatch(ctx, FileQuery{Path: dir}, true)
	if err != nil {
		t.Fatalf("DialWatch: %v", err)
	}
	defer conn.CloseNow()
	if _, err := c.DialWatch(ctx, FileQuery{Path: filepath.Join(dir, "nope")}, false); agentStatus(err) != 404 {
		t.Errorf("watch of a missing path: %v, want 404", err)
	}

	f := filepath.Join(dir, "sub", "f")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	want := []api.WatchEvent{{Type: "create", Path: f}, {Type: "write", Path: f}, {Type: "chmod", Path: f}, {Type: "remove", Path: f}}
	for _, w := range want {
		for {
			_, b, err := conn.Read(ctx)
			if err != nil {
				t.Fatalf("reading events, want %+v: %v", w, err)
			}
			var ev api.WatchEvent
			if err := json.Unmarshal(b, &ev); err != nil {
				t.Fatal(err)
			}
			if ev == w {
				break
			}
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")
}

// TestRefusedBodyAnswered uploads archives that turn bad after their first
// entry with 32 MiB still to come: the agent stops reading there, and the
// client must get its answer (invalid) every time, not a connection reset
// by the agent closing on a body still arriving.
func TestRefusedBodyAnswered(t *testing.T) {
	c, dir := newFilesAgent(t)
	ctx := context.Background()
	good := tarOf(t, [2]string{"f", strings.Repeat("x", 1<<20)}).Bytes()
	// The first entry and its data, without the two zero blocks that end
	// an archive; then blocks that are no tar header.
	good = good[:512+1<<20]
	for i := range 20 {
		body := io.MultiReader(bytes.NewReader(good), io.LimitReader(repeatByte('A'), 32<<20))
		start := time.Now()
		err := c.WriteArchive(ctx, FileQuery{Path: filepath.Join(dir, fmt.Sprint("dst", i))}, body)
		if agentStatus(err) != http.StatusBadRequest {
			t.Fatalf("upload %d: %v, want the agent's answer (400)", i, err)
		}
		if i == 0 {
			t.Logf("answered in %v: %v", time.Since(start).Round(time.Millisecond), err)
		}
	}
}

// repeatByte reads b for ever.
type repeatByte byte

func (r repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}
