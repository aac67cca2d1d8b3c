// Package imagetest builds OCI images for tests and serves them from a
// registry in the test's own process, on loopback.
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"loam.dev/loam/internal/testenv"
)

// Entry is one entry of a layer.
type Entry struct {
	Name string
	// Type is a tar type flag; a regular file when 0.
	Type     byte
	Body     []byte
	Link     string
	Mode     int64
	UID, GID int
}

// Layer is a tar stream of entries, parents not implied.
func Layer(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ, mode := e.Type, e.Mode
		if typ == 0 {
			typ = tar.TypeReg
		}
		if mode == 0 {
			mode = 0o644
			if typ == tar.TypeDir {
				mode = 0o755
			}
		}
		h := &tar.Header{Name: e.Name, Typeflag: typ, Mode: mode, Uid: e.UID, Gid: e.GID, Linkname: e.Link,
			ModTime: time.Unix(1700000000, 0)}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Image is an image of layers (tar streams, gzipped in it) with config.
func Image(t testing.TB, cfg v1.Config, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, l := range layers {
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(l)), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			t.Fatal(err)
		}
	}
	img, err := mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Busybox is a layer holding the host's static /bin/busybox with its
// applets in /bin, accounts root and app (uid 1500, home /home/app), and
// /srv owned by app: an image with no libc and no Debian in it. It skips
// (or, under CI=true, fails) the test when the host has no static busybox.
func Busybox(t testing.TB) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Missing(t, "no /bin/busybox: %v", err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	entries := []Entry{
		{Name: "bin/", Type: tar.TypeDir},
		{Name: "bin/busybox", Body: bb, Mode: 0o755},
		{Name: "etc/", Type: tar.TypeDir},
		{Name: "etc/passwd", Body: []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1500:1500:app:/home/app:/bin/sh\n")},
		{Name: "etc/group", Body: []byte("root:x:0:\napp:x:1500:\n")},
		{Name: "home/", Type: tar.TypeDir},
		{Name: "home/app/", Type: tar.TypeDir, UID: 1500, GID: 1500},
		{Name: "root/", Type: tar.TypeDir, Mode: 0o700},
		{Name: "srv/", Type: tar.TypeDir, UID: 1500, GID: 1500},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			entries = append(entries, Entry{Name: "bin/" + a, Type: tar.TypeSymlink, Link: "busybox"})
		}
	}
	return Layer(t, entries...)
}

// Registry serves an empty registry on loopback until the test ends, and
// returns its host (127.0.0.1:PORT). With a user name, it asks for basic
// auth with user and password.
func Registry(t testing.TB, user, password string) string {
	t.Helper()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if user != "" {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Push pushes img to ref, with basic auth when user is not empty.
func Push(t testing.TB, ref string, img v1.Image, user, password string) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	opts := []remote.Option{}
	if user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: user, Password: password}))
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
}

// BusyboxConfig is the config of the end-to-end tests' image (with
// Busybox's layer): no libc, no Debian, a user of its own, a working dir,
// env and an entrypoint.
var BusyboxConfig = v1.Config{
	Env:        []string{"PATH=/bin", "GREETING=from-image"},
	WorkingDir: "/srv",
	User:       "app",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{`echo "$GREETING as $(id -un) in $(pwd)" > /srv/started; exec sleep 100000`},
}
