package test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// readAll reads a file of a sandbox over the API.
func readAll(t *testing.T, c *client.Client, sb, path string, opts *client.FileOptions) (string, error) {
	t.Helper()
	r, err := c.ReadFile(harness.Ctx(t), sb, path, opts)
	if err != nil {
		return "", err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	return string(b), err
}

// TestFiles: files written over the API are read by the sandbox's processes
// and the other way round, as the sandbox's user; directories, moves,
// removals and tar archives; and the errors a user's mistakes get.
func TestFiles(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	c := d.C
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "f"}); err != nil {
		t.Fatal(err)
	}

	info, err := c.WriteFile(ctx, "f", "/home/loam/in/note.txt", strings.NewReader("from the API\n"), &client.FileOptions{Mode: 0o640})
	if err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if info.Size != 13 || info.Mode != "0640" || info.Type != api.FileTypeFile {
		t.Errorf("WriteFile answered %+v", info)
	}
	if got := d.Run("f", "sh", "-c", "cat /home/loam/in/note.txt; stat -c '%U %G %a' /home/loam/in/note.txt /home/loam/in"); got != "from the API\nloam loam 640\nloam loam 755\n" {
		t.Errorf("in the sandbox: %q", got)
	}
	d.Run("f", "sh", "-c", "mkdir -p /home/loam/out/sub && echo from the sandbox > /home/loam/out/sub/a.txt && ln -s sub/a.txt /home/loam/out/link")
	if got, err := readAll(t, c, "f", "/home/loam/out/sub/a.txt", nil); err != nil || got != "from the sandbox\n" {
		t.Errorf("ReadFile: %q, %v", got, err)
	}
	// Parts of a file: only they cross from the sandbox.
	for _, rc := range []struct {
		offset, length int64
		want           string
	}{{5, 3, "the"}, {5, 0, "the sandbox\n"}, {0, 4, "from"}, {16, 10, "\n"}, {17, 5, ""}, {1000, 0, ""}} {
		if got, err := readAll(t, c, "f", "/home/loam/out/sub/a.txt", &client.FileOptions{Offset: rc.offset, Length: rc.length}); err != nil || got != rc.want {
			t.Errorf("ReadFile offset %d length %d: %q, %v; want %q", rc.offset, rc.length, got, err, rc.want)
		}
	}
	if _, err := readAll(t, c, "f", "/home/loam/out/sub/a.txt", &client.FileOptions{Offset: -1}); harness.APICode(err) != api.CodeInvalid {
		t.Errorf("ReadFile offset -1: %v, want invalid", err)
	}
	for _, q := range []string{"length=-1", "offset=x", "length=1.5"} {
		code, body := d.Curl("GET", "/v1/sandboxes/f/files/content?path=/home/loam/out/sub/a.txt&"+q, "")
		if code != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid"`) {
			t.Errorf("GET content with %s: %d %s, want 400 invalid", q, code, body)
		}
	}
	list, err := c.ListFiles(ctx, "f", "/home/loam/out", &client.FileOptions{Depth: 2})
	if err != nil {
		t.Fatalf("ListFiles: %v", err)
	}
	if len(list.Entries) != 2 || list.Entries[0].Path != "/home/loam/out/link" || list.Entries[0].Type != api.FileTypeSymlink ||
		list.Entries[0].Target != "sub/a.txt" || len(list.Entries[1].Entries) != 1 || list.Entries[1].Entries[0].Size != 17 {
		t.Errorf("ListFiles: %+v", list)
	}

	if _, err := c.Mkdir(ctx, "f", "/home/loam/made/deep", nil); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	if _, err := c.MoveFile(ctx, "f", "/home/loam/in/note.txt", "/home/loam/made/deep/note.txt", nil); err != nil {
		t.Fatalf("MoveFile: %v", err)
	}
	if got := d.Run("f", "cat", "/home/loam/made/deep/note.txt"); got != "from the API\n" {
		t.Errorf("after the move: %q", got)
	}
	if err := c.RemoveFile(ctx, "f", "/home/loam/made", nil); harness.APICode(err) != api.CodeConflict {
		t.Errorf("removing a full directory: %v, want conflict", err)
	}
	if err := c.RemoveFile(ctx, "f", "/home/loam/made", &client.FileOptions{Recursive: true}); err != nil {
		t.Errorf("RemoveFile: %v", err)
	}
	if _, err := c.StatFile(ctx, "f", "/home/loam/made", nil); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("stat after remove: %v, want not_found", err)
	}

	// Archives: out/ down as a tar, and up again elsewhere.
	r, err := c.ReadArchive(ctx, "f", "/home/loam/out", nil)
	if err != nil {
		t.Fatalf("ReadArchive: %v", err)
	}
	tarball, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteArchive(ctx, "f", "/home/loam/copy", bytes.NewReader(tarball), nil); err != nil {
		t.Fatalf("WriteArchive: %v", err)
	}
	if got := d.Run("f", "sh", "-c", "cat /home/loam/copy/link; stat -c %U /home/loam/copy/sub/a.txt"); got != "from the sandbox\nloam\n" {
		t.Errorf("extracted: %q", got)
	}

	for _, tc := range []struct {
		name string
		err  error
		code api.Code
	}{
		{"missing file", func() error { _, err := readAll(t, c, "f", "/home/loam/nope", nil); return err }(), api.CodeNotFound},
		{"relative path", func() error { _, err := c.StatFile(ctx, "f", "home", nil); return err }(), api.CodeInvalid},
		{"a directory's content", func() error { _, err := readAll(t, c, "f", "/home/loam", nil); return err }(), api.CodeInvalid},
		{"loam reads root's", func() error {
			runAs(d, "root", "f", "sh", "-c", "echo s3cret > /etc/secret && chmod 600 /etc/secret")
			_, err := readAll(t, c, "f", "/etc/secret", nil)
			return err
		}(), api.CodeForbidden},
		{"loam writes to /etc", func() error {
			_, err := c.WriteFile(ctx, "f", "/etc/planted", strings.NewReader("x"), nil)
			return err
		}(), api.CodeForbidden},
		{"unknown user", func() error { _, err := c.StatFile(ctx, "f", "/", &client.FileOptions{User: "nobody-x"}); return err }(), api.CodeInvalid},
		{"no such sandbox", func() error { _, err := c.StatFile(ctx, "nope", "/", nil); return err }(), api.CodeNotFound},
		{"tar entry outside", c.WriteArchive(ctx, "f", "/home/loam/x", tarWith(t, "../../etc/evil"), &client.FileOptions{User: "root"}), api.CodeInvalid},
	} {
		if code := harness.APICode(tc.err); code != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, tc.err, tc.code)
		}
	}
	if _, _, code := runAs(d, "root", "f", "test", "-e", "/etc/evil"); code == 0 {
		t.Error("a tar entry landed outside its directory")
	}
	// root may.
	if _, err := c.WriteFile(ctx, "f", "/etc/planted", strings.NewReader("x"), &client.FileOptions{User: "root"}); err != nil {
		t.Errorf("root writes to /etc: %v", err)
	}
}

// tarWith is a tar of one file, name.
func tarWith(t *testing.T, name string) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: 1, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("x"))
	tw.Close()
	return &buf
}

// TestFilesNoHostPath: symlinks in a sandbox that name host paths (the
// host's /etc/shadow, a file of the test's, ../ chains) lead every files
// call to the sandbox's own files, never the host's: the sandbox's kernel
// resolves them.
func TestFilesNoHostPath(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	c := d.C
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	hostDir := t.TempDir()
	marker := filepath.Join(hostDir, "marker")
	if err := os.WriteFile(marker, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	up := strings.Repeat("../", 12)
	// The busybox image has no /etc/shadow: give the sandbox one, root's.
	runAs(d, "root", "s", "sh", "-c", "[ -e /etc/shadow ] || { echo 'root:sandbox:0:0:::::' > /etc/shadow; chmod 600 /etc/shadow; }")
	runAs(d, "root", "s", "sh", "-c", "ln -s /etc/shadow /home/loam/shadow && ln -s "+marker+" /home/loam/marker && ln -s "+up+strings.TrimPrefix(hostDir, "/")+" /home/loam/up && ln -s "+up+"etc /home/loam/etc")
	root := &client.FileOptions{User: "root"}

	// The sandbox's /etc/shadow, as root in it sees it; loam may not.
	inside, _, _ := runAs(d, "root", "s", "cat", "/etc/shadow")
	if got, err := readAll(t, c, "s", "/home/loam/shadow", root); err != nil || got != inside {
		t.Errorf("shadow through a symlink: %q, %v; the sandbox's is %q", got, err, inside)
	}
	if host, _ := os.ReadFile("/etc/shadow"); len(host) > 0 && inside == string(host) {
		t.Fatal("the sandbox's /etc/shadow is the host's")
	}
	if _, err := readAll(t, c, "s", "/home/loam/shadow", nil); harness.APICode(err) != api.CodeForbidden {
		t.Errorf("loam reads shadow: %v, want forbidden", err)
	}
	if got, err := readAll(t, c, "s", "/home/loam/etc/shadow", root); err != nil || got != inside {
		t.Errorf("shadow through ../: %q, %v", got, err)
	}
	// The host's paths do not exist in the sandbox.
	for _, p := range []string{"/home/loam/marker", "/home/loam/up/marker", marker} {
		if got, err := readAll(t, c, "s", p, root); harness.APICode(err) != api.CodeNotFound {
			t.Errorf("reading %s: %q, %v; want not_found", p, got, err)
		}
	}
	// Writes, moves and removals through them touch the sandbox's files.
	// up leads nowhere in the sandbox: its parent cannot be made (as
	// mkdir -p finds, a dangling symlink is in the way).
	if _, err := c.WriteFile(ctx, "s", "/home/loam/up/marker", strings.NewReader("overwritten"), root); harness.APICode(err) != api.CodeConflict {
		t.Errorf("writing through ../: %v, want conflict", err)
	}
	if _, err := c.WriteFile(ctx, "s", "/home/loam/marker", strings.NewReader("overwritten"), root); err != nil {
		t.Errorf("writing over a symlink: %v", err)
	}
	_ = c.RemoveFile(ctx, "s", "/home/loam/up", &client.FileOptions{User: "root", Recursive: true})
	d.Run("s", "touch", "/home/loam/tomove")
	if _, err := c.MoveFile(ctx, "s", "/home/loam/tomove", marker, root); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("moving to a host path: %v, want not_found (its directory is not in the sandbox)", err)
	}
	if err := c.WriteArchive(ctx, "s", hostDir, tarWith(t, "marker"), root); err != nil {
		t.Errorf("extracting into a host path: %v", err)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "host secret" {
		t.Fatalf("the host's file changed: %q, %v", b, err)
	}
	if des, _ := os.ReadDir(hostDir); len(des) != 1 {
		t.Fatalf("the host's directory holds %d entries", len(des))
	}
	if got := d.Run("s", "cat", "/home/loam/marker"); got != "overwritten" {
		t.Errorf("the sandbox's /home/loam/marker: %q", got)
	}
}

// TestFilesWatchCheckpoint: a watch reports what the sandbox's processes
// do, lives through a disk-only checkpoint, and ends with 1011 (an
// unavailable error) at a memory checkpoint.
func TestFilesWatchCheckpoint(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	c := d.C
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "w"}); err != nil {
		t.Fatal(err)
	}
	d.Run("w", "mkdir", "-p", "/home/loam/proj/src")
	w, err := c.Watch(ctx, "w", "/home/loam/proj", &client.FileOptions{Recursive: true})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	expect := func(want api.WatchEvent) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		for {
			ev, err := w.Next(wctx)
			if err != nil {
				t.Fatalf("waiting for %+v: %v", want, err)
			}
			if ev == want {
				return
			}
		}
	}
	d.Run("w", "sh", "-c", "echo x > /home/loam/proj/src/a.go")
	expect(api.WatchEvent{Type: api.WatchCreate, Path: "/home/loam/proj/src/a.go"})
	expect(api.WatchEvent{Type: api.WatchWrite, Path: "/home/loam/proj/src/a.go"})
	d.Run("w", "mv", "/home/loam/proj/src/a.go", "/home/loam/proj/b.go")
	expect(api.WatchEvent{Type: api.WatchRename, Path: "/home/loam/proj/src/a.go"})
	expect(api.WatchEvent{Type: api.WatchCreate, Path: "/home/loam/proj/b.go"})

	no := false
	if _, err := c.CreateCheckpoint(ctx, "w", api.CreateCheckpoint{Memory: &no}); err != nil {
		t.Fatalf("disk-only checkpoint: %v", err)
	}
	d.Run("w", "rm", "/home/loam/proj/b.go")
	expect(api.WatchEvent{Type: api.WatchRemove, Path: "/home/loam/proj/b.go"})

	if _, err := c.CreateCheckpoint(ctx, "w", api.CreateCheckpoint{}); err != nil {
		t.Fatalf("memory checkpoint: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		ev, err := w.Next(wctx)
		if err == nil {
			t.Logf("event before the end: %+v", ev)
			continue
		}
		if !errors.Is(err, client.ErrWatchEnded) || harness.APICode(err) != api.CodeUnavailable {
			t.Fatalf("after a memory checkpoint: %v, want ErrWatchEnded with unavailable", err)
		}
		break
	}
	// A new watch works on the resumed sandbox.
	w2, err := c.Watch(ctx, "w", "/home/loam/proj", nil)
	if err != nil {
		t.Fatalf("Watch after the checkpoint: %v", err)
	}
	defer w2.Close()
	d.Run("w", "touch", "/home/loam/proj/c")
	if ev, err := w2.Next(ctx); err != nil || ev.Path != "/home/loam/proj/c" {
		t.Errorf("after the checkpoint: %+v, %v", ev, err)
	}

	// A restore ends it too.
	if _, err := c.RestoreCheckpoint(ctx, "w", "v1"); err != nil {
		t.Fatalf("restore: %v", err)
	}
	for {
		ev, err := w2.Next(wctx)
		if err == nil {
			t.Logf("event before the restore: %+v", ev)
			continue
		}
		if !errors.Is(err, client.ErrWatchEnded) || harness.APICode(err) != api.CodeUnavailable {
			t.Fatalf("after a restore: %v, want ErrWatchEnded with unavailable", err)
		}
		break
	}
}

// pattern is an endless, cheap stream of bytes that are not all alike.
type pattern struct{ n uint64 }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		p.n++
		b[i] = byte(p.n ^ p.n>>8 ^ p.n>>17)
	}
	return len(b), nil
}

// rssPeak samples a memory figure every interval until stop is closed, and
// then sends the highest it saw.
func rssPeak(sample func() int64, interval time.Duration, stop <-chan struct{}) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var peak int64
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			peak = max(peak, sample())
			select {
			case <-stop:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// statusKiB is a field (VmRSS, VmHWM) of a /proc/PID/status text, in KiB.
func statusKiB(status, field string) int64 {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// TestFilesLarge streams a large file (LOAM_FILES_MIB, 256 MiB by default:
// twice the growth of memory it allows, so that holding the file in memory
// fails it; 1024 for the README's figures) up to a sandbox and back
// down, checking it arrives whole both ways, and that neither the daemon
// nor the agent holds it in memory. It logs the throughput and the peaks
// of memory.
func TestFilesLarge(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("hundreds of MiB each way")
	}
	mib := harness.EnvInt(t, "LOAM_FILES_MIB", 256)
	size := int64(mib) << 20
	d := harness.StartDaemon(t)
	// On a busy 2-core host with the race detector in the daemon, a
	// transfer has gone as slow as 6 MiB/s: harness.Ctx gives it 10
	// minutes.
	ctx := harness.Ctx(t)
	c := d.C
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "big"}); err != nil {
		t.Fatal(err)
	}
	daemonRSS := func() int64 {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(d.Cmd.Process.Pid) + "/status")
		return statusKiB(string(b), "VmRSS")
	}
	agentRSS := func() int64 {
		out, _, _, err := c.Output(ctx, "big", "cat", "/proc/1/status")
		if err != nil {
			return 0
		}
		return statusKiB(string(out), "VmRSS")
	}
	before, agentBefore := daemonRSS(), agentRSS()

	measure := func(what string, transfer func() error) {
		stop := make(chan struct{})
		dpeak := rssPeak(daemonRSS, 50*time.Millisecond, stop)
		apeak := rssPeak(agentRSS, time.Second, stop)
		start := time.Now()
		err := transfer()
		took := time.Since(start)
		close(stop)
		dp, ap := <-dpeak, <-apeak
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s %d MiB: %.1fs, %.0f MiB/s; daemon RSS %d MiB before, peak %d MiB; agent RSS %d MiB before, peak %d MiB",
			what, mib, took.Seconds(), float64(size)/took.Seconds()/(1<<20), before>>10, dp>>10, agentBefore>>10, ap>>10)
		// Bounded: far below the file, whatever the buffers.
		if dp-before > 128<<10 {
			t.Errorf("%s: the daemon's RSS grew by %d MiB", what, (dp-before)>>10)
		}
		if ap-agentBefore > 128<<10 {
			t.Errorf("%s: the agent's RSS grew by %d MiB", what, (ap-agentBefore)>>10)
		}
	}

	sent := sha256.New()
	measure("upload", func() error {
		_, err := c.WriteFile(ctx, "big", "/home/loam/big", io.TeeReader(io.LimitReader(&pattern{}, size), sent), nil)
		return err
	})
	want := hex.EncodeToString(sent.Sum(nil))
	if got := strings.Fields(d.Run("big", "sha256sum", "/home/loam/big")); len(got) == 0 || got[0] != want {
		t.Fatalf("in the sandbox: %v, sent %s", got, want)
	}
	got := sha256.New()
	measure("download", func() error {
		r, err := c.ReadFile(ctx, "big", "/home/loam/big", nil)
		if err != nil {
			return err
		}
		defer r.Close()
		n, err := io.Copy(got, r)
		if err == nil && n != size {
			err = io.ErrUnexpectedEOF
		}
		return err
	})
	if hex.EncodeToString(got.Sum(nil)) != want {
		t.Fatal("the download differs from the upload")
	}
}

// TestFilesCLI: loam cp in and out, of a file, of a directory (a tar, with
// a symlink in it), and of stdin and stdout; loam files ls, cat, mkdir, mv
// and rm.
func TestFilesCLI(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	if _, err := d.C.CreateSandbox(harness.Ctx(t), api.CreateSandbox{Name: "cli"}); err != nil {
		t.Fatal(err)
	}
	cli := func(in string, args ...string) string {
		t.Helper()
		out, errOut, code := d.CLI(in, args...)
		if code != 0 {
			t.Fatalf("loam %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	local := t.TempDir()
	site := filepath.Join(local, "site")
	if err := os.MkdirAll(filepath.Join(site, "css"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(site, "index.html"), []byte("<h1>hi</h1>\n"), 0o644)
	os.WriteFile(filepath.Join(site, "css", "a.css"), []byte("body{}\n"), 0o600)
	os.Symlink("index.html", filepath.Join(site, "home.html"))

	cli("", "cp", site, "cli:/home/loam/site")
	if got := cli("", "files", "cat", "cli", "/home/loam/site/index.html", "--offset", "1", "--length", "2"); got != "h1" {
		t.Errorf("loam files cat --offset 1 --length 2: %q", got)
	}
	if got := d.Run("cli", "sh", "-c", "cat /home/loam/site/home.html; stat -c '%U %a' /home/loam/site/css/a.css"); got != "<h1>hi</h1>\nloam 600\n" {
		t.Errorf("copied in: %q", got)
	}
	// Into an existing directory: as DST/NAME.
	cli("", "cp", filepath.Join(site, "index.html"), "cli:/home/loam")
	cli("hello stdin\n", "cp", "-", "cli:/home/loam/stdin.txt")
	if got := d.Run("cli", "cat", "/home/loam/index.html", "/home/loam/stdin.txt"); got != "<h1>hi</h1>\nhello stdin\n" {
		t.Errorf("copied in: %q", got)
	}

	out := filepath.Join(local, "out")
	cli("", "cp", "cli:/home/loam/site", out)
	if b, err := os.ReadFile(filepath.Join(out, "home.html")); err != nil || string(b) != "<h1>hi</h1>\n" {
		t.Errorf("copied out: %q, %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(out, "home.html")); err != nil || l != "index.html" {
		t.Errorf("the symlink copied out: %q, %v", l, err)
	}
	cli("", "cp", "cli:/home/loam/stdin.txt", local)
	if b, _ := os.ReadFile(filepath.Join(local, "stdin.txt")); string(b) != "hello stdin\n" {
		t.Errorf("a file copied out into a directory: %q", b)
	}
	if got := cli("", "cp", "cli:/home/loam/stdin.txt", "-"); got != "hello stdin\n" {
		t.Errorf("to stdout: %q", got)
	}

	ls := cli("", "files", "ls", "cli", "/home/loam/site", "--depth", "2")
	for _, want := range []string{"symlink", "/home/loam/site/home.html -> index.html", "/home/loam/site/css/a.css", "0600"} {
		if !strings.Contains(ls, want) {
			t.Errorf("files ls lacks %q:\n%s", want, ls)
		}
	}
	if got := cli("", "files", "cat", "cli", "/home/loam/site/index.html", "/home/loam/stdin.txt"); got != "<h1>hi</h1>\nhello stdin\n" {
		t.Errorf("files cat: %q", got)
	}
	cli("", "files", "mkdir", "cli", "/home/loam/a/b")
	cli("", "files", "mv", "cli", "/home/loam/stdin.txt", "/home/loam/a/b")
	if got := d.Run("cli", "cat", "/home/loam/a/b/stdin.txt"); got != "hello stdin\n" {
		t.Errorf("after mv: %q", got)
	}
	if _, errOut, code := d.CLI("", "files", "rm", "cli", "/home/loam/a"); code == 0 || !strings.Contains(errOut, "--yes") {
		t.Errorf("rm without a terminal or --yes: %d %q", code, errOut)
	}
	if _, errOut, code := d.CLI("", "files", "rm", "-y", "cli", "/home/loam/a"); code == 0 || !strings.Contains(errOut, "recursive") {
		t.Errorf("rm of a full directory: %d %q", code, errOut)
	}
	cli("", "files", "rm", "-r", "-y", "cli", "/home/loam/a")
	if _, errOut, code := d.CLI("", "files", "cat", "cli", "/home/loam/a/b/stdin.txt"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("cat after rm: %d %q", code, errOut)
	}
}

// TestFilesCheckpointCutsCalls: a memory checkpoint cuts the transfers in
// flight on its sandbox with a clear error: a download ends short (never
// passing for a whole file), an upload fails and leaves neither the file
// nor a temp file. The sandbox serves files again right after.
func TestFilesCheckpointCutsCalls(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	c := d.C
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "cut"}); err != nil {
		t.Fatal(err)
	}
	d.Run("cut", "sh", "-c", "head -c 268435456 /dev/zero > /home/loam/z")

	r, err := c.ReadFile(ctx, "cut", "/home/loam/z", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := io.CopyN(io.Discard, r, 1<<20); err != nil {
		t.Fatal(err)
	}

	pr, pw := io.Pipe()
	upload := make(chan error, 1)
	go func() {
		_, err := c.WriteFile(ctx, "cut", "/home/loam/up", pr, nil)
		pr.CloseWithError(errors.New("upload over"))
		upload <- err
	}()
	chunk := make([]byte, 1<<20)
	if _, err := pw.Write(chunk); err != nil {
		t.Fatal(err)
	}
	go func() { // the rest, until the upload is over
		for {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
	}()
	// The checkpoint comes once the agent writes the upload: its temp
	// file is in /home/loam.
	harness.Eventually(t, 20*time.Second, "the upload reaches the agent", func() error {
		if ls := d.Run("cut", "ls", "-a", "/home/loam"); !strings.Contains(ls, "up") {
			return fmt.Errorf("ls -a /home/loam: %q", ls)
		}
		return nil
	})

	if _, err := c.CreateCheckpoint(ctx, "cut", api.CreateCheckpoint{}); err != nil {
		t.Fatalf("memory checkpoint: %v", err)
	}
	n, err := io.Copy(io.Discard, r)
	if !errors.Is(err, client.ErrShortRead) {
		t.Errorf("download after a memory checkpoint: %d more bytes, %v; want ErrShortRead", n, err)
	}
	select {
	case err := <-upload:
		var ae *api.Error
		switch {
		case err == nil:
			t.Error("the upload went through a memory checkpoint")
		case errors.As(err, &ae) && (ae.Code != api.CodeUnavailable || !strings.Contains(ae.Message, "cut short")):
			t.Errorf("upload: %v, want unavailable, cut short", err)
		default:
			t.Logf("upload: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the upload did not end")
	}
	// The agent removes its temp file once it sees the body end, which
	// may come a moment after the daemon answered.
	harness.Eventually(t, 5*time.Second, "a cut upload's temp file removed", func() error {
		if got := d.Run("cut", "ls", "-a", "/home/loam"); strings.Contains(got, "up") {
			return fmt.Errorf("/home/loam holds: %q", got)
		}
		return nil
	})
	if _, err := c.WriteFile(ctx, "cut", "/home/loam/after", strings.NewReader("ok"), nil); err != nil {
		t.Errorf("writing after the checkpoint: %v", err)
	}
}
