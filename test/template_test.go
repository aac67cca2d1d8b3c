package test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/archive/archivetest"
	"loam.dev/loam/test/harness"
)

// findTemplate returns the template called name in d's listing, or nil.
func findTemplate(t *testing.T, d *harness.Daemon, name string) *api.Template {
	t.Helper()
	tpls, err := d.C.Templates(harness.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tpl := range tpls {
		if tpl.Name == name {
			return &tpl
		}
	}
	return nil
}

// TestTemplateFromCheckpoint: a memory checkpoint kept as a template starts
// sandboxes that count on from it, after its sandbox and checkpoint are
// gone; a disk-only one boots fresh with the files; a template in use
// cannot be deleted, nor can a built-in.
func TestTemplateFromCheckpoint(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.PutSecret(ctx, "key", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", SecretFiles: map[string]string{"/home/loam/.key": "key"}}); err != nil {
		t.Fatal(err)
	}
	d.Run("src", "sh", "-c", "echo one > /home/loam/f")
	if got := d.Run("src", "cat", "/home/loam/.key"); got != "s3cret" {
		t.Fatalf("src's secret file holds %q", got)
	}
	counter(t, d, "src")
	var cp *api.Checkpoint
	win := checkpointCounting(t, d, "src", func() {
		var err error
		if cp, err = d.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Name: "tick"}); err != nil {
			t.Fatal(err)
		}
	})
	warm, err := d.C.CreateTemplate(ctx, "warm", "src", "tick")
	if err != nil || warm.Name != "warm" || !warm.Memory || warm.Kind != api.TemplateCheckpoint || warm.State != api.TemplateReady || warm.From != "src/"+cp.ID || warm.SizeBytes == 0 {
		t.Fatalf("CreateTemplate: %v %+v", err, warm)
	}
	f := false
	disk, err := d.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Memory: &f})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateTemplate(ctx, "cold", "src", disk.ID); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		name, sb, cp string
		want         error
	}{
		{"warm", "src", "tick", api.ErrConflict},
		{"busybox", "src", "tick", api.ErrConflict},
		{"Bad/Name", "src", "tick", api.ErrInvalid},
		{"x", "nope", "tick", api.ErrNotFound},
		{"x", "src", "v99", api.ErrNotFound},
	} {
		if _, err := d.C.CreateTemplate(ctx, bad.name, bad.sb, bad.cp); !errors.Is(err, bad.want) {
			t.Errorf("CreateTemplate(%s from %s/%s) = %v, want %v", bad.name, bad.sb, bad.cp, err, bad.want)
		}
	}

	// The template outlives its checkpoint and its sandbox.
	if err := d.C.DeleteCheckpoint(ctx, "src", "tick"); err != nil {
		t.Fatal(err)
	}
	if err := d.C.DeleteSandbox(ctx, "src"); err != nil {
		t.Fatal(err)
	}

	created := time.Now()
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "w1", Template: "warm"})
	if err != nil || sb.Template != "warm" || sb.State != api.StateRunning {
		t.Fatalf("create from warm: %v %+v", err, sb)
	}
	counts(t, d, "w1", win.startsFrom(t, d, "w1", created))
	if got := strings.TrimSpace(d.Run("w1", "hostname")); got != "w1" {
		t.Errorf("hostname of w1 = %q", got)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "w2", Template: "warm", Resources: &api.Resources{MemoryMiB: 1024}}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("create from a memory template with resources: %v, want invalid", err)
	}

	// A disk-only template boots fresh: the files, no counter.
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "c1", Template: "cold"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(d.Run("c1", "cat", "/home/loam/f")); got != "one" {
		t.Errorf("c1's /home/loam/f = %q, want one", got)
	}
	// The source's secret files are not the template's.
	if out, _, code, err := d.C.Output(ctx, "c1", "cat", "/home/loam/.key"); err != nil || code == 0 || strings.Contains(string(out), "s3cret") {
		t.Errorf("c1 has the source's secret file: %q %d %v", out, code, err)
	}
	if got := strings.TrimSpace(d.Run("c1", "hostname")); got != "c1" {
		t.Errorf("hostname of c1 = %q", got)
	}
	still := readCount(t, d, "c1")
	time.Sleep(500 * time.Millisecond)
	if again := readCount(t, d, "c1"); again != still {
		t.Errorf("c1 counts (%d then %d): a disk-only template should boot fresh", still, again)
	}

	if tpl := findTemplate(t, d, "warm"); tpl == nil || tpl.Uses != 1 || !tpl.Ready {
		t.Errorf("listing of warm: %+v, want 1 use", tpl)
	}
	if tpl := findTemplate(t, d, "busybox"); tpl == nil || tpl.Kind != api.TemplateBuiltin || tpl.State != api.TemplateReady || tpl.Uses != 0 {
		t.Errorf("listing of busybox: %+v", tpl)
	}
	if err := d.C.DeleteTemplate(ctx, "warm"); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "w1") {
		t.Errorf("deleting a template in use: %v, want a conflict naming w1", err)
	}
	if err := d.C.DeleteTemplate(ctx, "busybox"); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("deleting a built-in: %v, want forbidden", err)
	}
	if err := d.C.DeleteSandbox(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if snaps, _ := filepath.Glob(filepath.Join(d.DataDir, "disk", "mnt", "snapshots", "tpl.warm.*")); len(snaps) != 1 {
		t.Errorf("the template's disk snapshots: %v, want one", snaps)
	}
	if err := d.C.DeleteTemplate(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	if err := d.C.DeleteTemplate(ctx, "warm"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("deleting it again: %v, want not found", err)
	}
	if findTemplate(t, d, "warm") != nil {
		t.Error("warm is still listed")
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "w3", Template: "warm"}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("create from a deleted template: %v, want invalid", err)
	}
	if snaps, _ := filepath.Glob(filepath.Join(d.DataDir, "disk", "mnt", "snapshots", "tpl.warm.*")); len(snaps) != 0 {
		t.Errorf("the deleted template's disk is left: %v", snaps)
	}

	// A restarted daemon keeps templates.
	d.Stop()
	d.Start()
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "c2", Template: "cold"}); err != nil {
		t.Fatalf("create from a template after a restart: %v", err)
	}
}

// TestTemplateBuild: loam template build runs the commands in a sandbox,
// streaming their output, and keeps the result; the sandbox goes.
func TestTemplateBuild(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	stdout, stderr, code := d.CLI("", "template", "build", "tb", "--template", "busybox",
		"--run", "echo built > /home/loam/built", "--run", "echo hello from the build",
		"--service", "tick=while true; do date +%s > /tmp/tick; sleep 0.1; done", "--memory")
	if code != 0 || !strings.Contains(stdout, "hello from the build\n") || !strings.HasSuffix(stdout, "tb\n") {
		t.Fatalf("template build: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if sbs, err := d.C.ListSandboxes(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Errorf("sandboxes after the build: %v %v, want none", sbs, err)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "b1", Template: "tb"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(d.Run("b1", "cat", "/home/loam/built")); got != "built" {
		t.Errorf("/home/loam/built = %q", got)
	}
	// The service was running at the checkpoint: it runs on.
	first := d.Run("b1", "cat", "/tmp/tick")
	waitFor(t, func() bool { return d.Run("b1", "cat", "/tmp/tick") != first })

	// A failing command stops the build and leaves no template nor sandbox.
	_, stderr, code = d.CLI("", "template", "build", "tf", "--template", "busybox", "--run", "exit 3")
	if code == 0 || !strings.Contains(stderr, "status 3") {
		t.Errorf("a failing build: exit %d, stderr %q", code, stderr)
	}
	if findTemplate(t, d, "tf") != nil {
		t.Error("a failed build left template tf")
	}
	if sbs, _ := d.C.ListSandboxes(ctx, client.ListOptions{}); len(sbs) != 1 {
		t.Errorf("a failed build left sandboxes: %v", sbs)
	}
	// export to a terminal-less stdout and import through the CLI.
	archive, stderr, code := d.CLI("", "template", "export", "tb")
	if code != 0 || len(archive) == 0 {
		t.Fatalf("export: exit %d, %q", code, stderr)
	}
	out, stderr, code := d.CLI(archive, "template", "import", "tb2")
	if code != 0 || out != "tb2\n" {
		t.Fatalf("import: exit %d, %q %q", code, out, stderr)
	}
	out, _, _ = d.CLI("", "templates")
	if !strings.Contains(out, "checkpoint+memory") || !strings.Contains(out, "tb2") {
		t.Errorf("loam templates:\n%s", out)
	}
}

// TestTemplateExportImport: a template exported from one daemon and
// imported into another starts sandboxes there that count on; damaged
// archives are refused and leave nothing.
func TestTemplateExportImport(t *testing.T) {
	t.Parallel()
	d1 := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d1.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src"}); err != nil {
		t.Fatal(err)
	}
	d1.Run("src", "sh", "-c", "echo moved > /home/loam/f")
	counter(t, d1, "src")
	win := checkpointCounting(t, d1, "src", func() {
		if _, err := d1.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Name: "tick"}); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := d1.C.CreateTemplate(ctx, "warm", "src", "tick"); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := d1.C.ExportTemplate(ctx, "warm", &buf)
	if err != nil || n == 0 || int(n) != buf.Len() {
		t.Fatalf("export: %d bytes, %v", n, err)
	}
	if _, err := d1.C.ExportTemplate(ctx, "busybox", &bytes.Buffer{}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("exporting a built-in: %v, want invalid", err)
	}
	if _, err := d1.C.ExportTemplate(ctx, "nope", &bytes.Buffer{}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("exporting a template that is not there: %v, want not found", err)
	}
	archive := buf.Bytes()

	d2 := harness.StartDaemon(t)
	// A byte flipped two thirds in, or the next one whose flip changes
	// what the archive decodes to: a few bits of zstd's framing decode
	// to the same archive, which is then rightly taken.
	var flipped []byte
	content := archivetest.Unzstd(archive)
	for i := len(archive) * 2 / 3; i < len(archive); i++ {
		flipped = bytes.Clone(archive)
		flipped[i] ^= 0x01
		if f := archivetest.Unzstd(flipped); f == nil || !bytes.Equal(f, content) {
			break
		}
	}
	for _, bad := range []struct {
		name string
		data []byte
		want string
	}{
		{"truncated", archive[:len(archive)/2], "cut short"},
		{"flipped byte", flipped, "refused"},
		{"traversal", craftArchive(t, "disk/../../escaped"), "not clean"},
		{"absolute", craftArchive(t, "/tmp/loam-escaped"), "absolute"},
		{"not an archive", []byte("hello"), "refused"},
	} {
		_, err := d2.C.ImportTemplate(ctx, "bad", bytes.NewReader(bad.data))
		if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("import of a %s archive: %v, want invalid with %q", bad.name, err, bad.want)
		}
	}
	if findTemplate(t, d2, "bad") != nil {
		t.Error("a refused import is listed")
	}
	if left, _ := os.ReadDir(filepath.Join(d2.DataDir, "checkpoint-templates")); len(left) != 0 {
		t.Errorf("refused imports left %v", left)
	}
	if snaps, _ := filepath.Glob(filepath.Join(d2.DataDir, "disk", "mnt", "snapshots", "tpl.*")); len(snaps) != 0 {
		t.Errorf("refused imports left snapshots %v", snaps)
	}
	if _, err := os.Stat(filepath.Join(d2.DataDir, "escaped")); err == nil {
		t.Error("a traversal entry was written")
	}

	tpl, err := d2.C.ImportTemplate(ctx, "moved", bytes.NewReader(archive))
	if err != nil || !tpl.Memory || tpl.Name != "moved" {
		t.Fatalf("import: %v %+v", err, tpl)
	}
	if snaps, _ := filepath.Glob(filepath.Join(d2.DataDir, "disk", "mnt", "snapshots", "tpl.*")); len(snaps) != 1 {
		t.Errorf("template snapshots after the import: %v, want one", snaps)
	}
	if _, err := d2.C.ImportTemplate(ctx, "moved", bytes.NewReader(archive)); !errors.Is(err, api.ErrConflict) {
		t.Errorf("importing over a template: %v, want conflict", err)
	}
	created := time.Now()
	if _, err := d2.C.CreateSandbox(ctx, api.CreateSandbox{Name: "there", Template: "moved"}); err != nil {
		t.Fatal(err)
	}
	counts(t, d2, "there", win.startsFrom(t, d2, "there", created))
	if got := strings.TrimSpace(d2.Run("there", "cat", "/home/loam/f")); got != "moved" {
		t.Errorf("/home/loam/f = %q", got)
	}
}

// craftArchive makes an archive whose checksums are right but that holds
// an entry called evil.
func craftArchive(t *testing.T, evil string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	manifest, _ := json.Marshal(map[string]any{"format": 1, "name": "x", "memory": false, "resources": map[string]any{}, "created_at": time.Now()})
	for _, e := range []struct {
		typ  byte
		name string
		body []byte
	}{{tar.TypeReg, "manifest.json", manifest}, {tar.TypeDir, "disk", nil}, {tar.TypeReg, evil, []byte("evil")}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: e.typ, Name: e.name, Mode: 0o644, Size: int64(len(e.body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestTemplateCrash: a daemon killed while it imports a template shows no
// template after its restart, and its start removes what the import left,
// and what a crash between a template's disk and its publication leaves.
func TestTemplateCrash(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src"}); err != nil {
		t.Fatal(err)
	}
	f := false
	cp, err := d.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Memory: &f})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.CreateTemplate(ctx, "kept", "src", cp.ID); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := d.C.ExportTemplate(ctx, "kept", &buf); err != nil {
		t.Fatal(err)
	}

	kept := filepath.Join(d.DataDir, "checkpoint-templates")
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := d.C.ImportTemplate(ctx, "half", pr)
		done <- err
	}()
	go pw.Write(buf.Bytes()[:buf.Len()/2]) // and then nothing: the import waits for more
	waitFor(t, func() bool {
		entries, _ := os.ReadDir(kept)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".tmp-import-half-") {
				return true
			}
		}
		return false
	})
	d.Kill()
	pw.CloseWithError(errors.New("the daemon was killed"))
	if err := <-done; err == nil {
		t.Fatal("an import cut by a kill succeeded")
	}
	// What a crash after a template's disk was made, before it was
	// published, leaves: a snapshot and a work directory.
	planted := filepath.Join(d.DataDir, "disk", "mnt", "snapshots", "tpl.planted.0123456789ab")
	if out, err := exec.Command("btrfs", "subvolume", "create", planted).CombinedOutput(); err != nil {
		t.Fatalf("planting a snapshot: %v %s", err, out)
	}
	if err := os.Mkdir(filepath.Join(kept, ".tmp-planted-1"), 0o700); err != nil {
		t.Fatal(err)
	}

	d.Start()
	if findTemplate(t, d, "half") != nil || findTemplate(t, d, "planted") != nil {
		t.Error("a half-made template is listed after a restart")
	}
	if entries, _ := os.ReadDir(kept); len(entries) != 1 || entries[0].Name() != "kept" {
		t.Errorf("after a restart the templates directory holds %v, want kept alone", entries)
	}
	if snaps, _ := filepath.Glob(filepath.Join(d.DataDir, "disk", "mnt", "snapshots", "tpl.*")); len(snaps) != 1 || !strings.HasPrefix(filepath.Base(snaps[0]), "tpl.kept.") {
		t.Errorf("after a restart the template snapshots are %v, want kept's alone", snaps)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "after", Template: "kept"}); err != nil {
		t.Errorf("create from a template after a crash: %v", err)
	}
}
