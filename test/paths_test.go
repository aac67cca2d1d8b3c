package test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/test/harness"
)

// tarOf makes a tar of entries: a name ending in / is a directory, one
// with "->" a symlink ("name->target"), anything else a file of body x.
func tarOf(t *testing.T, mode int64, names ...string) *bytes.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		h := &tar.Header{Name: n, Mode: mode, Typeflag: tar.TypeReg, Size: 1}
		if name, target, ok := strings.Cut(n, "->"); ok {
			h.Name, h.Linkname, h.Typeflag, h.Size = name, target, tar.TypeSymlink, 0
		} else if strings.HasSuffix(n, "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("x"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(buf.Bytes())
}

// TestPathsUploadSymlinks is the two attacks of issue 20, item 3, on a
// real sandbox, whose gVisor kernel follows a symlink opened with
// O_DIRECTORY|O_NOFOLLOW: a tar whose own symlink climbs out
// (d -> ../../.., then d/tmp/x), and a symlink the sandbox's unprivileged
// user planted (proj/conf -> /etc) under root's upload of conf/ 0777.
// Neither may write outside the upload's directory or change /etc.
func TestPathsUploadSymlinks(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	c := d.C
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	root := &client.FileOptions{User: "root"}

	err := c.WriteArchive(ctx, "p", "/home/loam/up", tarOf(t, 0o644, "d->../../..", "d/tmp/x"), root)
	if harness.APICode(err) != api.CodeInvalid {
		t.Errorf("tar through its own climbing symlink: %v, want invalid", err)
	}
	if out, _, code := runAs(d, "root", "p", "ls", "-la", "/tmp/x"); code == 0 {
		t.Errorf("the tar wrote /tmp/x: %s", out)
	}

	d.Run("p", "sh", "-c", "mkdir -p /home/loam/proj && ln -s /etc /home/loam/proj/conf")
	before := d.Run("p", "stat", "-c", "%a %U", "/etc")
	err = c.WriteArchive(ctx, "p", "/home/loam/proj", tarOf(t, 0o777, "conf/", "conf/app.ini"), root)
	if harness.APICode(err) != api.CodeInvalid {
		t.Errorf("root's upload through the user's symlink: %v, want invalid", err)
	}
	if after := d.Run("p", "stat", "-c", "%a %U", "/etc"); after != before {
		t.Errorf("/etc was %q, is %q after root's upload", before, after)
	}
	if out, _, code := runAs(d, "root", "p", "ls", "-la", "/etc/app.ini"); code == 0 {
		t.Errorf("root's upload wrote /etc/app.ini: %s", out)
	}
	if _, _, code := runAs(d, "loam", "p", "touch", "/etc/owned"); code == 0 {
		t.Error("the sandbox's user can write /etc")
	}
	// The planted link is the user's: a file entry at its name replaces
	// it, and the upload of an innocent tree beside it works.
	if err := c.WriteArchive(ctx, "p", "/home/loam/proj", tarOf(t, 0o755, "src/", "src/main.go"), root); err != nil {
		t.Errorf("an innocent upload: %v", err)
	}
	if got := d.Run("p", "cat", "/home/loam/proj/src/main.go"); got != "x" {
		t.Errorf("src/main.go: %q", got)
	}
}

// TestPathsInSandbox runs the path tests of the extractor and of the
// agent's files and archive code inside a real sandbox, as root, where
// gVisor's syscalls are the ones that count (they run on the host's kernel
// in go test).
func TestPathsInSandbox(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	c := d.C
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "k"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ pkg, run string }{
		{"./internal/archive", "."},
		{"./internal/agent/files", "FuzzExtractTar"},
		{"./internal/agent", "TestFilesArchive|TestFilesRefused|TestFilesRoundTrip|TestIdentityWriterFollowsNoLink"},
	} {
		func() {
			bin := filepath.Join(t.TempDir(), "x.test")
			build := exec.Command("go", "test", "-c", "-o", bin, tc.pkg)
			build.Dir = ".."
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("building the tests of %s: %v\n%s", tc.pkg, err, out)
			}
			f, err := os.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			in := "/root/" + filepath.Base(tc.pkg) + ".test"
			if _, err := c.WriteFile(ctx, "k", in, f, &client.FileOptions{User: "root", Mode: 0o755}); err != nil {
				t.Fatal(err)
			}
			out, errb, code := runAs(d, "root", "k", in, "-test.run", tc.run, "-test.v", "-test.count=1")
			if code != 0 || !strings.Contains(out, "\nPASS") {
				t.Fatalf("%s inside the sandbox: exit %d\n%s\n%s", tc.pkg, code, out, errb)
			}
			t.Logf("%s inside the sandbox: %d tests passed", tc.pkg, strings.Count(out, "--- PASS"))
		}()
	}
}

// deepTree is a shell line that makes, beneath the working directory,
// levels directories of 200-byte names by cd (no path is ever given whole)
// and a file f holding body in the last.
func deepTree(levels int, body string) string {
	return fmt.Sprintf(`i=0; while [ $i -lt %d ]; do n=$(printf '%%03d%%0197d' $i 0); mkdir $n && cd $n || exit 1; i=$((i+1)); done; echo %s > f`, levels, body)
}

// chain is the path of the first levels directories of deepTree.
func chain(levels int) string {
	var parts []string
	for i := range levels {
		parts = append(parts, fmt.Sprintf("%03d%0197d", i, 0))
	}
	return strings.Join(parts, "/")
}

// readDeepTree is a shell line that reads f at the bottom of deepTree.
func readDeepTree(levels int) string {
	return fmt.Sprintf(`i=0; while [ $i -lt %d ]; do cd $(printf '%%03d%%0197d' $i 0) || exit 1; i=$((i+1)); done; cat f`, levels)
}

// TestPathsTemplateRoundTrip: every template loam exports imports again
// (issue 20, item 6): a relative symlink that climbs past / (valid in
// Linux), a path just under PATH_MAX in the sandbox and one past it, which
// the host reaches only by descriptor, its data dir's path before them;
// and what cannot be imported is a 4xx naming the entry.
func TestPathsTemplateRoundTrip(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	c := d.C
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "src"}); err != nil {
		t.Fatal(err)
	}
	// near: 4046 bytes to f. far: the same 20 levels moved beneath 6
	// more, 5262 bytes (no shell goes there by cd: they are moved there).
	d.Run("src", "sh", "-c", "cd /home/loam && ln -s ../../../etc up && mkdir near far far2 && cd near && "+deepTree(20, "near"))
	d.Run("src", "sh", "-c", "cd /home/loam/far2 && "+deepTree(20, "far"))
	d.Run("src", "sh", "-c", "cd /home/loam/far && "+deepTree(6, "b")+" && mv /home/loam/far2 /home/loam/far/"+chain(6)+"/")
	noMemory := false
	if _, err := c.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Name: "cp", Memory: &noMemory}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTemplate(ctx, "deep", "src", "cp"); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := c.ExportTemplate(ctx, "deep", &buf); err != nil {
		t.Fatalf("export: %v", err)
	}
	if _, err := c.ImportTemplate(ctx, "back", bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatalf("importing loam's own export: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "dst", Template: "back"}); err != nil {
		t.Fatal(err)
	}
	if got := d.Run("dst", "readlink", "/home/loam/up"); got != "../../../etc\n" {
		t.Errorf("/home/loam/up -> %q", got)
	}
	if got := d.Run("dst", "sh", "-c", "cd /home/loam/up && pwd -P"); got != "/etc\n" {
		t.Errorf("/home/loam/up leads to %q, want /etc", got)
	}
	if got := d.Run("dst", "sh", "-c", "cd /home/loam/near && "+readDeepTree(20)); got != "near\n" {
		t.Errorf("the path near PATH_MAX: %q", got)
	}
	d.Run("dst", "sh", "-c", "mv /home/loam/far/"+chain(6)+"/far2 /home/loam/far2")
	if got := d.Run("dst", "sh", "-c", "cd /home/loam/far2 && "+readDeepTree(20)); got != "far\n" {
		t.Errorf("the path past PATH_MAX: %q", got)
	}

	long := "disk/" + strings.Repeat("n", 300)
	_, err := c.ImportTemplate(ctx, "bad", bytes.NewReader(craftArchive(t, long)))
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), long) {
		t.Errorf("importing a name no file system takes: %v, want invalid naming the entry", err)
	}
}
