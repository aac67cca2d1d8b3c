package disk_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/testenv"
)

// counted wraps t's Build to count how often it runs.
func counted(t disk.Template, n *atomic.Int32) disk.Template {
	build := t.Build
	t.Build = func(ctx context.Context, dir string) error {
		n.Add(1)
		return build(ctx, dir)
	}
	return t
}

func TestBusyboxTemplate(t *testing.T) {
	testenv.Root(t)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Missing(t, "needs busybox-static: %v", err)
	}
	ctx := t.Context()
	tpl, err := disk.FindTemplate("busybox", disk.TemplateOptions{})
	must(t, err)
	var builds atomic.Int32
	tpl = counted(tpl, &builds)
	cacheDir := t.TempDir()
	var cache disk.Cache

	// Racing builders build once and all get the same tree.
	var wg sync.WaitGroup
	dirs := make([]string, 3)
	for i := range dirs {
		wg.Go(func() {
			var err error
			dirs[i], err = cache.EnsureBuilt(ctx, cacheDir, tpl)
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := builds.Load(); n != 1 {
		t.Errorf("built %d times, want once", n)
	}
	dir := dirs[0]
	if dirs[1] != dir || dirs[2] != dir {
		t.Errorf("builders got different trees: %q", dirs)
	}
	if want := filepath.Join(cacheDir, tpl.Key()); dir != want {
		t.Errorf("tree at %s, want %s", dir, want)
	}

	if target, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q, %v; want busybox", target, err)
	}
	checkOwner(t, filepath.Join(dir, "home/loam"), 1000)
	checkPerm(t, filepath.Join(dir, "tmp"), os.ModeDir|os.ModeSticky|0o777)
	for _, f := range []string{"etc/hostname", "etc/hosts", "etc/group", "root", "proc", "sys", "dev"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	// The tree runs: its shell works and knows the user.
	out, err := exec.Command("chroot", dir, "/bin/sh", "-c", "id -u loam; echo ~loam; grep ^loam: /etc/passwd | cut -d: -f7").CombinedOutput()
	if got, want := string(out), "1000\n/home/loam\n/bin/sh\n"; err != nil || got != want {
		t.Errorf("in the tree: %q, %v; want %q", got, err, want)
	}

	// Into a pool, once, however many ask.
	pool := newCopy(t)
	for range 3 {
		wg.Go(func() {
			if err := cache.EnsureTemplate(ctx, pool, cacheDir, tpl); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := builds.Load(); n != 1 {
		t.Errorf("built %d times, want once", n)
	}
	v, err := pool.CreateVolume(ctx, "v", tpl.Name)
	must(t, err)
	if _, err := os.Lstat(filepath.Join(v, "bin/sh")); err != nil {
		t.Error(err)
	}
}

func TestCacheFailedBuild(t *testing.T) {
	ctx := t.Context()
	cacheDir := t.TempDir()
	var cache disk.Cache
	fail := true
	tpl := disk.Template{
		Name:   "flaky",
		Recipe: "flaky/1",
		Build: func(ctx context.Context, dir string) error {
			if err := os.WriteFile(filepath.Join(dir, "half"), nil, 0o644); err != nil {
				return err
			}
			if fail {
				return errors.New("build broke")
			}
			return nil
		},
	}
	if _, err := cache.EnsureBuilt(ctx, cacheDir, tpl); err == nil {
		t.Fatal("failed build reported success")
	}
	entries, err := os.ReadDir(cacheDir)
	must(t, err)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("failed build left %s", e.Name())
		}
	}
	fail = false
	dir, err := cache.EnsureBuilt(ctx, cacheDir, tpl)
	must(t, err)
	if _, err := os.Stat(filepath.Join(dir, "half")); err != nil {
		t.Error(err)
	}
}

func TestTemplateKey(t *testing.T) {
	a := disk.Template{Name: "base", Recipe: "one"}
	b := disk.Template{Name: "base", Recipe: "two"}
	if !regexp.MustCompile(`^base-[0-9a-f]{12}$`).MatchString(a.Key()) {
		t.Errorf("Key = %q, want base-<12 hex>", a.Key())
	}
	if a.Key() == b.Key() {
		t.Errorf("recipes %q and %q share key %s", a.Recipe, b.Recipe, a.Key())
	}
	names := map[string]bool{}
	for _, tpl := range disk.Templates(disk.TemplateOptions{}) {
		if tpl.Name == "" || tpl.Description == "" || tpl.Recipe == "" || tpl.Build == nil {
			t.Errorf("template %q is incomplete", tpl.Name)
		}
		names[tpl.Name] = true
	}
	if !names[disk.DefaultTemplate] || !names["busybox"] {
		t.Errorf("Templates() = %v, want %s and busybox", names, disk.DefaultTemplate)
	}
	if _, err := disk.FindTemplate("nope", disk.TemplateOptions{}); !errors.Is(err, disk.ErrNotFound) {
		t.Errorf("FindTemplate(nope): %v, want ErrNotFound", err)
	}
}

// templateCache is where the base template is cached across test runs and
// packages: building it takes a minute.
func templateCache() string {
	if dir := os.Getenv("LOAM_TEMPLATE_CACHE"); dir != "" {
		return dir
	}
	return "/var/cache/loam/templates"
}

// TestBaseTemplate builds (or finds cached) the Debian template. It needs
// the network and a minute, so it runs only with LOAM_TEST_BASE=1 or in CI.
func TestBaseTemplate(t *testing.T) {
	if os.Getenv("LOAM_TEST_BASE") != "1" && !testenv.CI() {
		t.Skip("set LOAM_TEST_BASE=1 to build the Debian template (about a minute, needs the network)")
	}
	testenv.Root(t)
	if _, err := exec.LookPath("debootstrap"); err != nil {
		if _, err := os.Stat("/usr/sbin/debootstrap"); err != nil {
			t.Fatal("needs debootstrap")
		}
	}
	tpl, err := disk.FindTemplate(disk.DefaultTemplate, disk.TemplateOptions{})
	must(t, err)
	var cache disk.Cache
	dir, err := cache.EnsureBuilt(t.Context(), templateCache(), tpl)
	must(t, err)

	for _, f := range []string{"usr/bin/python3", "usr/bin/pgrep", "etc/ssl/certs/ca-certificates.crt", "bin/bash"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	checkOwner(t, filepath.Join(dir, "home/loam"), 1000)
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*Packages*"} {
		if m, _ := filepath.Glob(filepath.Join(dir, glob)); len(m) > 0 {
			t.Errorf("apt caches left: %d files like %s", len(m), m[0])
		}
	}
	script := "python3 -c 'print(6*7)'; id -u loam; getent passwd loam | cut -d: -f6,7; pgrep -x nosuchprocess || echo none"
	out, err := exec.Command("chroot", dir, "/bin/sh", "-c", script).CombinedOutput()
	if got, want := string(out), "42\n1000\n/home/loam:/bin/bash\nnone\n"; err != nil || got != want {
		t.Errorf("in the tree: %q, %v; want %q", got, err, want)
	}
}

func checkOwner(t *testing.T, path string, uid uint32) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Error(err)
		return
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || st.Gid != uid {
		t.Errorf("%s owned by %d:%d, want %d:%d", path, st.Uid, st.Gid, uid, uid)
	}
}

func checkPerm(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Error(err)
		return
	}
	if got := fi.Mode() & (os.ModeType | os.ModePerm | os.ModeSticky); got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
}

// TestCacheProgress: a build's own reports are the first 95% of its
// template's preparation, seen by Progress while it runs; none is under way
// before or after.
func TestCacheProgress(t *testing.T) {
	var cache disk.Cache
	reported, finish := make(chan struct{}), make(chan struct{})
	tpl := disk.Template{
		Name:   "slow",
		Recipe: "slow/1",
		Build: func(ctx context.Context, dir string) error {
			disk.ReportProgress(ctx, 0.5)
			disk.ReportProgress(ctx, 0.25) // never goes down
			close(reported)
			<-finish
			return os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
		},
	}
	if _, ok := cache.Progress("slow"); ok {
		t.Fatal("progress of a template not being prepared")
	}
	pool := newCopy(t)
	errc := make(chan error, 1)
	go func() { errc <- cache.EnsureTemplate(t.Context(), pool, t.TempDir(), tpl) }()
	<-reported
	if got, ok := cache.Progress("slow"); !ok || math.Abs(got-0.5*0.95) > 1e-9 {
		t.Errorf("Progress during the build = %v, %v; want %v, true", got, ok, 0.5*0.95)
	}
	close(finish)
	must(t, <-errc)
	if got, ok := cache.Progress("slow"); ok {
		t.Errorf("Progress after the build = %v, want none under way", got)
	}
}

// TestCacheLogsImport: a template already in the cache is imported into a
// new pool (as at a daemon's restart on a new pool) with a line that says
// so, and no "building template" line, which would send its reader looking
// for a build that never ran.
func TestCacheLogsImport(t *testing.T) {
	var cache disk.Cache
	cacheDir := t.TempDir()
	tpl := disk.Template{
		Name:   "cached",
		Recipe: "cached/1",
		Build: func(ctx context.Context, dir string) error {
			return os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
		},
	}
	if _, err := cache.EnsureBuilt(t.Context(), cacheDir, tpl); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
	defer slog.SetDefault(prev)
	must(t, cache.EnsureTemplate(t.Context(), newCopy(t), cacheDir, tpl))
	if got := log.String(); strings.Contains(got, `msg="building template" template=cached`) || !strings.Contains(got, `msg="importing template" template=cached`) {
		t.Errorf("the log of an import from the cache:\n%s", got)
	}
}

// blockingImport is a pool whose imports wait, once started, until
// release is closed.
type blockingImport struct {
	disk.Pool
	started, release chan struct{}
}

func (p *blockingImport) ImportTemplate(ctx context.Context, name, dir string) error {
	close(p.started)
	<-p.release
	return p.Pool.ImportTemplate(ctx, name, dir)
}

// TestCacheRemoveWaitsForImport: a daemon removing a tree of the template
// cache it shares with another (an image deleted) waits for the other's
// import of that tree to end, which would otherwise find it gone.
func TestCacheRemoveWaitsForImport(t *testing.T) {
	var importer, remover disk.Cache // two daemons' caches
	cacheDir := t.TempDir()
	tpl := disk.Template{
		Name:   "shared",
		Recipe: "shared/1",
		Build: func(ctx context.Context, dir string) error {
			return os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
		},
	}
	tree, err := importer.EnsureBuilt(t.Context(), cacheDir, tpl)
	must(t, err)
	pool := &blockingImport{Pool: newCopy(t), started: make(chan struct{}), release: make(chan struct{})}
	imported := make(chan error, 1)
	go func() { imported <- importer.EnsureTemplate(t.Context(), pool, cacheDir, tpl) }()
	<-pool.started

	var log testenv.SyncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
	defer slog.SetDefault(prev)
	removed := make(chan error, 1)
	go func() { removed <- remover.RemoveBuilt(context.Background(), cacheDir, tpl) }()
	for !strings.Contains(log.String(), "waiting for another daemon's use of the template's tree") {
		select {
		case err := <-removed:
			t.Fatalf("RemoveBuilt returned (%v) during the other daemon's import", err)
		default:
			runtime.Gosched()
		}
	}
	close(pool.release)
	must(t, <-imported)
	must(t, <-removed)
	if _, err := os.Stat(tree); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the tree after RemoveBuilt: %v", err)
	}
	if ok, err := pool.HasTemplate(t.Context(), "shared"); err != nil || !ok {
		t.Errorf("the pool's template after the import: %v, %v", ok, err)
	}
}
