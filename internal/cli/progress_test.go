package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// slowAPI is a daemon slow enough that the CLI shows progress: uploads are
// read at 4 MiB/s, and a create waits 2 s for template base, whose build is
// at 40%.
func slowAPI(t *testing.T) (srv *httptest.Server, received func() int64) {
	var (
		mu  sync.Mutex
		got int64
	)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{sandbox}/files", func(w http.ResponseWriter, r *http.Request) {
		replyErr(w, api.Errorf(api.CodeNotFound, "no such file"))
	})
	mux.HandleFunc("PUT /v1/sandboxes/{sandbox}/files/content", func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 256<<10)
		for {
			n, err := r.Body.Read(buf)
			mu.Lock()
			got += int64(n)
			mu.Unlock()
			if err != nil {
				break
			}
			time.Sleep(time.Second / 16)
		}
		reply(w, 200, api.FileInfo{Path: r.URL.Query().Get("path"), Type: api.FileTypeFile, Size: got})
	})
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, api.TemplateList{Templates: []api.Template{
			{Name: "base", Default: true, Progress: 40},
			{Name: "localhost:5000/app:v1", Kind: api.TemplateImage, State: api.TemplateBuilding, Progress: 65},
		}})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Second)
		reply(w, 201, api.Sandbox{ID: "sb-2kjiso7vff5b", Name: "web", State: api.StateRunning, Template: "base", CreatedAt: t0})
	})
	srv = httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, func() int64 { mu.Lock(); defer mu.Unlock(); return got }
}

// bigFile makes a local file of n bytes.
func bigFile(t *testing.T, n int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(p, bytes.Repeat([]byte("x"), n), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runOn runs the CLI against srv with stdout and stderr the given files.
func runOn(srv *httptest.Server, stdout, stderr *os.File, args ...string) int {
	a := &app{
		stdin: strings.NewReader(""), stdout: stdout, stderr: stderr,
		getenv:      func(string) string { return "" },
		connect:     func() (*client.Client, error) { return client.New(srv.URL, "tok"), nil },
		interactive: func() bool { return false },
	}
	root := newRoot(a)
	root.SetArgs(args)
	return Execute(context.Background(), root)
}

// TestProgressNotOnPipes: a long cp and a create that waits for a template
// print what they always did and no progress when their output is not a
// terminal (files here, as under a script or CI).
func TestProgressNotOnPipes(t *testing.T) {
	srv, received := slowAPI(t)
	src := bigFile(t, 8<<20)
	dir := t.TempDir()
	stdout, err := os.Create(filepath.Join(dir, "stdout"))
	must(t, err)
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	must(t, err)
	start := time.Now()
	if code := runOn(srv, stdout, stderr, "cp", src, "scratch:/home/loam/big"); code != 0 {
		t.Fatalf("cp: exit %d", code)
	}
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("the copy took %v: too short to show progress anyway", took)
	}
	if got := received(); got != 8<<20 {
		t.Errorf("the daemon got %d bytes, want %d", got, 8<<20)
	}
	if code := runOn(srv, stdout, stderr, "create", "web"); code != 0 {
		t.Fatalf("create: exit %d", code)
	}
	out, _ := os.ReadFile(stdout.Name())
	errOut, _ := os.ReadFile(stderr.Name())
	if !strings.HasPrefix(string(out), "name:        web\n") || strings.Contains(string(out), "%") {
		t.Errorf("stdout %q, want the sandbox's block alone", out)
	}
	if len(errOut) != 0 {
		t.Errorf("stderr %q, want nothing", errOut)
	}
}

// onTerminal runs the CLI with stdout and stderr on a pseudo-terminal and
// returns what the terminal showed.
func onTerminal(t *testing.T, srv *httptest.Server, args ...string) string {
	t.Helper()
	ptmx, tty, err := pty.Open()
	must(t, err)
	defer ptmx.Close()
	defer tty.Close()
	var (
		mu     sync.Mutex
		screen bytes.Buffer
	)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			mu.Lock()
			screen.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	code := runOn(srv, tty, tty, args...)
	// Everything the command wrote is read once a mark written after it is.
	const mark = "--end of output--"
	_, err = tty.WriteString(mark)
	must(t, err)
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		out := screen.String()
		mu.Unlock()
		if strings.HasSuffix(out, mark) {
			out = strings.TrimSuffix(out, mark)
			if code != 0 {
				t.Fatalf("loam %v: exit %d; terminal: %q", args, code, out)
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("terminal output did not end: %q", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProgressCpOnTerminal: a copy that takes seconds shows a bar with the
// bytes copied of the file's size.
func TestProgressCpOnTerminal(t *testing.T) {
	srv, _ := slowAPI(t)
	screen := onTerminal(t, srv, "cp", bigFile(t, 8<<20), "scratch:/home/loam/big")
	if !strings.Contains(screen, "copying to scratch:/home/loam/big") {
		t.Errorf("terminal %q: no progress of the copy", screen)
	}
	if !regexp.MustCompile(`\d+(\.\d+)?( [KM]iB)?/8\.0 MiB`).MatchString(screen) {
		t.Errorf("terminal %q: no count of MiB copied out of 8", screen)
	}
}

// TestProgressCreateOnTerminal: a create that waits for its template's
// build shows the build's progress.
func TestProgressCreateOnTerminal(t *testing.T) {
	srv, _ := slowAPI(t)
	screen := onTerminal(t, srv, "create", "web")
	if !strings.Contains(screen, "building template base") || !strings.Contains(screen, "40%") {
		t.Errorf("terminal %q: no progress of the template's build", screen)
	}
	if !strings.Contains(screen, "name:        web") {
		t.Errorf("terminal %q: no sandbox block", screen)
	}
}

// TestProgressCreateFromImageOnTerminal: a create that waits for its
// image's pull shows the pull (the image is listed as a template).
func TestProgressCreateFromImageOnTerminal(t *testing.T) {
	srv, _ := slowAPI(t)
	screen := onTerminal(t, srv, "create", "web", "--image", "localhost:5000/app:v1")
	if !strings.Contains(screen, "pulling localhost:5000/app:v1") || !strings.Contains(screen, "65%") {
		t.Errorf("terminal %q: no progress of the image's pull", screen)
	}
}

// TestTarSize: the size a bar expects of a directory's tar is the tar's.
func TestTarSize(t *testing.T) {
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "a/b"), 0o755))
	for name, n := range map[string]int{"f": 0, "a/g": 1, "a/b/h": 513, "a/b/i": 70000} {
		must(t, os.WriteFile(filepath.Join(dir, name), bytes.Repeat([]byte("y"), n), 0o644))
	}
	must(t, os.Symlink("f", filepath.Join(dir, "link")))
	var buf bytes.Buffer
	must(t, writeLocalTar(&buf, dir))
	if got := tarSize(dir); got != int64(buf.Len()) {
		t.Errorf("tarSize = %d, the tar has %d bytes", got, buf.Len())
	}
	if _, err := tar.NewReader(&buf).Next(); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
