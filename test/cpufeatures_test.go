package test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// TestCPUFeaturesPinned: --cpu-features pins what sandboxes see of the
// CPU (as a cluster pins it to what every node has, so that a memory image
// restores on any): a feature left out of the list is not in a sandbox's
// /proc/cpuinfo, where a daemon without the flag shows it; a memory
// checkpoint of the pinned sandbox forks; a name gVisor does not know is
// refused at start.
func TestCPUFeaturesPinned(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(harness.Runsc(), "cpu-features").Output()
	if err != nil {
		t.Fatal(err)
	}
	host := strings.Split(strings.TrimSpace(string(out)), ",")
	plain := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	if _, err := plain.C.CreateSandbox(ctx, api.CreateSandbox{Name: "all"}); err != nil {
		t.Fatal(err)
	}
	seen := strings.Fields(plain.Run("all", "sh", "-c", "grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2"))
	// The feature to leave out: one the host has and a sandbox sees.
	drop := ""
	for _, f := range []string{"avx2", "avx", "sse4_2", "popcnt"} {
		if slices.Contains(host, f) && slices.Contains(seen, f) {
			drop = f
			break
		}
	}
	if drop == "" {
		t.Fatalf("none of the features to leave out is both on the host (%v) and in a sandbox (%v)", host, seen)
	}
	kept := slices.DeleteFunc(slices.Clone(host), func(f string) bool { return f == drop })
	d := harness.StartDaemon(t, "--cpu-features", strings.Join(kept, ","))
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "pinned"}); err != nil {
		t.Fatal(err)
	}
	pinned := strings.Fields(d.Run("pinned", "sh", "-c", "grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2"))
	if slices.Contains(pinned, drop) {
		t.Errorf("a sandbox pinned without %s sees it: %v", drop, pinned)
	}
	if !slices.Contains(pinned, "sse2") {
		t.Errorf("a pinned sandbox lost sse2, which the list keeps: %v", pinned)
	}
	d.Run("pinned", "sh", "-c", "echo before > /home/loam/mark")
	if _, err := d.C.CreateCheckpoint(ctx, "pinned", api.CreateCheckpoint{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.C.Fork(ctx, "pinned", "v1", "pinned-fork"); err != nil {
		t.Fatalf("a fork of a pinned sandbox's memory checkpoint: %v", err)
	}
	if got := d.Run("pinned-fork", "sh", "-c", "cat /home/loam/mark; grep -c -w "+drop+" /proc/cpuinfo || true"); got != "before\n0\n" {
		t.Errorf("the fork: %q, want its mark and no %s", got, drop)
	}

	dir, err := os.MkdirTemp("", "loam-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	bad := &harness.Daemon{T: t, DataDir: dir, Subnet: harness.NextSubnet()}
	t.Cleanup(func() { bad.Destroy() })
	if err := bad.Launch("--cpu-features", "sse2,warp-drive"); err == nil || !strings.Contains(bad.Log.String(), `"warp-drive" is not a feature`) {
		t.Errorf("a daemon given an unknown CPU feature: %v\n%s", err, bad.Log.String())
		if err == nil {
			bad.Stop()
		}
	}
}
