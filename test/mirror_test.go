package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// TestDebianMirror: the daemon builds base from the mirror it is given
// (LOAM_DEBIAN_MIRROR here), not from deb.debian.org, and a failed build
// says which mirror it tried; and the offline path the docs give works: a
// base tree copied into a template cache under its key (the same on every
// host and for every mirror) is imported without running debootstrap.
// debootstrap is a fake on the daemon's PATH that records its arguments
// and fails as an unreachable mirror does: no test leaves the machine.
func TestDebianMirror(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	argsFile := filepath.Join(bin, "args")
	fake := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + argsFile + "\necho 'E: Failed getting release file' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "debootstrap"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	const mirror = "http://127.0.0.1:9/debian"
	env := []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "LOAM_DEBIAN_MIRROR=" + mirror}
	newDaemon := func(cache string) *harness.Daemon {
		dataDir, err := os.MkdirTemp("", "loam-e2e-")
		if err != nil {
			t.Fatal(err)
		}
		d := &harness.Daemon{T: t, DataDir: dataDir, Subnet: harness.NextSubnet(), Env: env}
		d.Start("--default-template", "base", "--template-cache", cache)
		t.Cleanup(func() { d.Destroy() })
		return d
	}

	// No base in the cache: the daemon starts building it at once, from
	// the mirror.
	d := newDaemon(t.TempDir())
	ctx := harness.Ctx(t)
	var base api.Template
	waitFor(t, func() bool {
		tpls, err := d.C.Templates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range tpls {
			if tp.Name == "base" {
				base = tp
			}
		}
		return base.State == api.TemplateFailed
	})
	if !strings.Contains(base.Error, mirror) {
		t.Errorf("the failed build's error %q does not name the mirror %s", base.Error, mirror)
	}
	args, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatalf("debootstrap never ran: %v", err)
	}
	if a := strings.Fields(string(args)); len(a) == 0 || a[len(a)-1] != mirror {
		t.Errorf("debootstrap ran with %q, want the mirror %s last", a, mirror)
	}
	d.Destroy()
	os.Remove(argsFile)

	// Offline: a tree put in the cache under base's key is imported, and
	// debootstrap is not run. (The busybox tree stands in for a base built
	// elsewhere: what matters is that it is taken as base.)
	busybox, _ := filepath.Glob(filepath.Join(harness.TemplateCache(), "busybox-*"))
	if len(busybox) == 0 {
		t.Fatalf("no busybox template in %s to stand in for base", harness.TemplateCache())
	}
	cache := t.TempDir()
	if out, err := exec.Command("cp", "-a", busybox[0], filepath.Join(cache, "base-4e8ff98926d0")).CombinedOutput(); err != nil {
		t.Fatalf("copying a tree into the cache: %v %s", err, out)
	}
	d = newDaemon(cache)
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "offline", Template: "base"}); err != nil {
		t.Fatalf("a sandbox of base from a copied tree: %v", err)
	}
	d.Run("offline", "true")
	if _, err := os.Stat(argsFile); err == nil {
		t.Error("debootstrap ran although base's tree was in the cache")
	}
}
