package image_test

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/store"
	"loam.dev/loam/internal/store/sqlite"
)

type fixture struct {
	svc   *image.Service
	st    *sqlite.Store
	pool  disk.Pool
	creds *image.Credentials
}

// newService runs a Service over a new store and copy pool until the test ends.
func newService(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loam.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pool, err := disk.NewCopy(filepath.Join(dir, "pool"))
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, secret.KeySize)
	rand.Read(key)
	sealed, err := secret.NewSealed(st.RegistryCredentials(), key)
	if err != nil {
		t.Fatal(err)
	}
	creds := image.NewCredentials(sealed, "default")
	svc := image.New(image.Config{Records: st, Sandboxes: st, Pool: pool, CacheDir: filepath.Join(dir, "cache"),
		Org: "default", Keychain: creds.For, Log: slog.New(slog.DiscardHandler)})
	run(t, svc)
	return &fixture{svc: svc, st: st, pool: pool, creds: creds}
}

// run runs svc until the test ends; then it checks that Run returns, with
// no error, once its ctx has ended.
func run(t *testing.T, svc *image.Service) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run still running 10 s after its ctx ended")
		}
	})
}

// layers is a three-layer image's layers: the third removes a file and a
// directory of the first and makes /var/cache opaque.
func layers(t *testing.T) [][]byte {
	return [][]byte{
		imagetest.Layer(t,
			imagetest.Entry{Name: "etc/", Type: tar.TypeDir},
			imagetest.Entry{Name: "etc/passwd", Body: []byte("root:x:0:0:root:/root:/bin/sh\nweb:x:33:33:web:/var/www:/bin/sh\n")},
			imagetest.Entry{Name: "etc/motd", Body: []byte("old")},
			imagetest.Entry{Name: "var/cache/", Type: tar.TypeDir},
			imagetest.Entry{Name: "var/cache/stale", Body: []byte("stale")},
			imagetest.Entry{Name: "opt/gone/", Type: tar.TypeDir},
			imagetest.Entry{Name: "opt/gone/file", Body: []byte("x")},
		),
		imagetest.Layer(t,
			imagetest.Entry{Name: "srv/", Type: tar.TypeDir, UID: 33, GID: 33, Mode: 0o750},
			imagetest.Entry{Name: "srv/app", Body: []byte("app"), Mode: 0o755, UID: 33, GID: 33},
			imagetest.Entry{Name: "srv/app-link", Type: tar.TypeLink, Link: "srv/app"},
		),
		imagetest.Layer(t,
			imagetest.Entry{Name: "etc/.wh.motd"},
			imagetest.Entry{Name: "opt/.wh.gone"},
			imagetest.Entry{Name: "var/cache/.wh..wh..opq"},
			imagetest.Entry{Name: "var/cache/fresh", Body: []byte("fresh")},
		),
	}
}

var appConfig = v1.Config{
	Env: []string{"PATH=/usr/bin:/bin", "GREETING=hello"}, WorkingDir: "/srv", User: "web",
	Entrypoint: []string{"/srv/app"}, Cmd: []string{"--port", "8080"},
}

func wait(t *testing.T, svc *image.Service, id string) *api.Image {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		im, err := svc.Get(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if im.State != api.ImagePulling || time.Now().After(deadline) {
			return im
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPullFromRegistry(t *testing.T) {
	f := newService(t)
	reg := imagetest.Registry(t, "", "")
	ref := reg + "/app:v1"
	img := imagetest.Image(t, appConfig, layers(t)...)
	imagetest.Push(t, ref, img, "", "")

	im, err := f.svc.Pull(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if im.State != api.ImagePulling || im.Ref != ref || im.ID != image.ID(ref) {
		t.Errorf("Pull answered %+v, want it pulling %s", im, ref)
	}
	im = wait(t, f.svc, im.ID)
	digest, _ := img.Digest()
	if im.State != api.ImageReady || im.Digest != digest.String() || im.Size == 0 || im.Pulled != im.Size {
		t.Fatalf("after the pull: %+v; want ready, digest %s, pulled = size > 0", im, digest)
	}
	if !slices.Equal(im.Config.Cmd, appConfig.Cmd) || im.Config.User != "web" || im.Config.WorkingDir != "/srv" {
		t.Errorf("config %+v, want %+v", im.Config, appConfig)
	}
	res, err := f.svc.Ensure(t.Context(), "default", ref)
	if err != nil {
		t.Fatal(err)
	}
	root, err := f.pool.CreateVolume(t.Context(), "vol", res.Template)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"srv/app": "app", "srv/app-link": "app", "var/cache/fresh": "fresh"} {
		if got, err := os.ReadFile(filepath.Join(root, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"etc/motd", "opt/gone", "var/cache/stale"} {
		if _, err := os.Lstat(filepath.Join(root, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it gone", name, err)
		}
	}
	// A pool that lost the template gets it again from the next Ensure.
	if err := f.pool.(*disk.Copy).DeleteTemplate(t.Context(), res.Template); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Ensure(t.Context(), "default", ref); err != nil {
		t.Fatalf("Ensure once the pool lost the template: %v", err)
	}
	if ok, err := f.pool.HasTemplate(t.Context(), res.Template); !ok || err != nil {
		t.Errorf("the template is not back: %v, %v", ok, err)
	}
	// A second reference to the same content shares the template.
	imagetest.Push(t, reg+"/other:v1", img, "", "")
	res2, err := f.svc.Ensure(t.Context(), "default", reg+"/other:v1")
	if err != nil || res2.Template != res.Template {
		t.Errorf("the same image under another name: %+v, %v; want template %s", res2, err, res.Template)
	}
	// Removing one of the two keeps the template the other has; removing
	// both takes it out of the pool, and the volume made from it stays.
	if err := f.svc.Remove(t.Context(), "default", im.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Get(t.Context(), im.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after Remove: %v, want not_found", err)
	}
	if ok, _ := f.pool.HasTemplate(t.Context(), res.Template); !ok {
		t.Errorf("template %s gone while another image has it", res.Template)
	}
	if err := f.svc.Remove(t.Context(), "default", image.ID(reg+"/other:v1")); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.pool.HasTemplate(t.Context(), res.Template); ok || err != nil {
		t.Errorf("template %s still in the pool (%v) once no image has it", res.Template, err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "srv/app")); err != nil || string(got) != "app" {
		t.Errorf("the volume after its image's removal: %q, %v", got, err)
	}
}

// TestDeleteInUse: an image a sandbox uses is not deleted (a conflict
// naming the sandbox); once none does, it is, and a create's hold on it
// ends with its release.
func TestDeleteInUse(t *testing.T) {
	f := newService(t)
	ctx := t.Context()
	reg := imagetest.Registry(t, "", "")
	ref := reg + "/used:v1"
	imagetest.Push(t, ref, imagetest.Image(t, appConfig, layers(t)...), "", "")
	if _, err := f.svc.Pull(ctx, ref); err != nil {
		t.Fatal(err)
	}
	im := wait(t, f.svc, image.ID(ref))
	res, release, err := f.svc.Hold(ctx, "default", ref)
	if err != nil || res.Ref != ref {
		t.Fatalf("Hold: %+v, %v", res, err)
	}
	sb := &store.Sandbox{Sandbox: api.Sandbox{ID: "sb-000000000001", Name: "web", State: api.StateRunning, Image: ref, CreatedAt: store.Now()}}
	if err := f.st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	release()
	err = f.svc.Delete(ctx, im.ID)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeConflict || ae.Message != "image "+ref+" is used by sandbox web" {
		t.Fatalf("Delete of an image in use: %v, want a conflict naming web", err)
	}
	if _, err := f.svc.Get(ctx, im.ID); err != nil {
		t.Fatalf("the image after a refused delete: %v", err)
	}
	if err := f.st.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Delete(ctx, im.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Delete(ctx, im.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Delete again: %v, want not_found", err)
	}
	if _, _, err := f.svc.Hold(ctx, "default", ref); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Hold of a deleted image: %v, want not_found", err)
	}
}

func TestPullRefusals(t *testing.T) {
	f := newService(t)
	reg := imagetest.Registry(t, "", "")
	ghost := appConfig
	ghost.User = "ghost:ghost"
	imagetest.Push(t, reg+"/ghost:v1", imagetest.Image(t, ghost, layers(t)...), "", "")
	if _, err := f.svc.Ensure(t.Context(), "default", reg+"/ghost:v1"); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("an image whose user is missing: %v, want invalid", err)
	}
	if _, err := f.svc.Ensure(t.Context(), "default", reg+"/missing:v1"); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("an image the registry lacks: %v, want invalid", err)
	}
	if _, err := f.svc.Pull(t.Context(), "UPPER:case:bad"); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a bad reference: %v, want invalid", err)
	}
}

func TestPullWithLogin(t *testing.T) {
	f := newService(t)
	reg := imagetest.Registry(t, "alice", "s3cret")
	ref := reg + "/private:v1"
	imagetest.Push(t, ref, imagetest.Image(t, appConfig, layers(t)...), "alice", "s3cret")
	if _, err := f.svc.Ensure(t.Context(), "default", ref); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("a private image before login: %v, want invalid", err)
	}
	if _, err := f.creds.Login(t.Context(), reg, api.RegistryLogin{Username: "alice", Password: "s3cret"}); err != nil {
		t.Fatal(err)
	}
	list, err := f.creds.List(t.Context())
	if err != nil || len(list) != 1 || list[0].Registry != reg || list[0].Username != "alice" {
		t.Errorf("registries: %+v, %v", list, err)
	}
	if _, err := f.svc.Ensure(t.Context(), "default", ref); err != nil {
		t.Fatalf("a private image after login: %v", err)
	}
	if err := f.creds.Logout(t.Context(), reg); err != nil {
		t.Fatal(err)
	}
}

func TestPullFromHost(t *testing.T) {
	f := newService(t)
	img := imagetest.Image(t, v1.Config{User: "app", Cmd: []string{"sh"}}, imagetest.Busybox(t))
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.com/bb:v1")
	tarPath := filepath.Join(dir, "bb.tar")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{filepath.Join(dir, "oci"), tarPath} {
		res, err := f.svc.Ensure(t.Context(), "default", ref)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		root, err := f.pool.CreateVolume(t.Context(), filepath.Base(ref), res.Template)
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(filepath.Join(root, "bin/sh")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s: bin/sh is %v, %v; want busybox's link", ref, fi, err)
		}
	}
}

// slowBlobs serves h, writing the bodies of blob downloads 32 KiB at a
// time with a pause between, so that a pull can be seen part-way.
type slowBlobs struct{ h http.Handler }

func (s slowBlobs) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
		w = &slowWriter{ResponseWriter: w}
	}
	s.h.ServeHTTP(w, r)
}

type slowWriter struct{ http.ResponseWriter }

func (w *slowWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), 32<<10)]
		m, err := w.ResponseWriter.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		w.ResponseWriter.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond)
		p = p[len(chunk):]
	}
	return n, nil
}

// TestPullProgress: while an image is pulled, Get shows the bytes read so
// far, between none and all of its size, and they only grow.
func TestPullProgress(t *testing.T) {
	f := newService(t)
	srv := httptest.NewServer(slowBlobs{registry.New(registry.Logger(log.New(io.Discard, "", 0)))})
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/slow:v1"
	data := make([]byte, 1<<20)
	rand.Read(data) // incompressible: the layer stays 1 MiB
	imagetest.Push(t, ref, imagetest.Image(t, v1.Config{}, imagetest.Layer(t, imagetest.Entry{Name: "blob", Body: data})), "", "")

	im, err := f.svc.Pull(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	var seen []int64
	for {
		got, err := f.svc.Get(t.Context(), im.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != api.ImagePulling {
			if got.State != api.ImageReady || got.Pulled != got.Size {
				t.Fatalf("after the pull: %+v", got)
			}
			break
		}
		if got.Size > 0 && got.Pulled > 0 && got.Pulled < got.Size {
			seen = append(seen, got.Pulled)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(seen) < 2 || !slices.IsSorted(seen) {
		t.Errorf("progress seen during the pull: %v; want it part-way, growing", seen)
	}
}

// TestRunResumes: a pull a previous daemon left "pulling" in the store is
// taken up by the next Run.
func TestRunResumes(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loam.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // after Run's end (cleanups run last first)
	pool, err := disk.NewCopy(filepath.Join(dir, "pool"))
	if err != nil {
		t.Fatal(err)
	}
	reg := imagetest.Registry(t, "", "")
	ref := reg + "/left:v1"
	imagetest.Push(t, ref, imagetest.Image(t, appConfig, layers(t)...), "", "")
	if err := st.PutImage(t.Context(), &store.Image{Image: api.Image{
		ID: image.ID(ref), Ref: ref, State: api.ImagePulling, CreatedAt: store.Now(),
	}}); err != nil {
		t.Fatal(err)
	}
	svc := image.New(image.Config{Records: st, Pool: pool, CacheDir: filepath.Join(dir, "cache"), Log: slog.New(slog.DiscardHandler)})
	run(t, svc)
	if im := wait(t, svc, image.ID(ref)); im.State != api.ImageReady {
		t.Errorf("the pull left unfinished: %+v, want it ready", im)
	}
}

// TestSweep: Sweep deletes the pool templates of images no record names
// (a delete cut short between the record and the template), and keeps the
// templates of images there are and those of no image.
func TestSweep(t *testing.T) {
	f := newService(t)
	reg := imagetest.Registry(t, "", "")
	ref := reg + "/kept:v1"
	imagetest.Push(t, ref, imagetest.Image(t, appConfig, layers(t)...), "", "")
	if _, err := f.svc.Pull(t.Context(), ref); err != nil {
		t.Fatal(err)
	}
	if im := wait(t, f.svc, image.ID(ref)); im.State != api.ImageReady {
		t.Fatalf("pull: %+v", im)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"image-0123456789abcdef", "busybox"} {
		if err := f.pool.ImportTemplate(t.Context(), name, src); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.svc.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	lister := f.pool.(interface {
		Templates(context.Context) ([]string, error)
	})
	names, err := lister.Templates(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, "image-0123456789abcdef") || !slices.Contains(names, "busybox") || len(names) != 2 {
		t.Errorf("templates after the sweep: %v; want busybox and the pulled image's", names)
	}
	if _, err := f.svc.Ensure(t.Context(), "default", ref); err != nil {
		t.Errorf("the pulled image after the sweep: %v", err)
	}
}
