package test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// TestUpgradeKeepsAgents: a daemon restarted with another agent binary (an
// upgrade) wakes a sandbox that slept before it, and forks a memory
// checkpoint taken before it, with the binary their memory was made with:
// a memory image maps the agent's pages from the file mounted at
// /.loam/loam, and the new binary under the old memory crashed the agent.
// New sandboxes run the new binary.
func TestUpgradeKeepsAgents(t *testing.T) {
	t.Parallel()
	d := harness.StartDaemon(t)
	ctx := harness.Ctx(t)
	sum := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	inside := func(sb string) string {
		return strings.Fields(d.Run(sb, "sha256sum", "/.loam/loam"))[0]
	}
	oldSum := sum(harness.LoamBin)
	for _, name := range []string{"sleeper", "source"} {
		if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: name}); err != nil {
			t.Fatal(err)
		}
		if got := inside(name); got != oldSum {
			t.Fatalf("%s runs agent %s, want the daemon's %s", name, got, oldSum)
		}
	}
	d.Run("sleeper", "sh", "-c", "echo before > /dev/shm/mem")
	if _, err := d.C.Sleep(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
	cp, err := d.C.CreateCheckpoint(ctx, "source", api.CreateCheckpoint{})
	if err != nil {
		t.Fatal(err)
	}

	// The upgrade: another binary (the same one with bytes appended, so
	// another file by content).
	b, err := os.ReadFile(harness.LoamBin)
	if err != nil {
		t.Fatal(err)
	}
	newer := filepath.Join(t.TempDir(), "loam-newer")
	if err := os.WriteFile(newer, append(b, "a newer loam"...), 0o755); err != nil {
		t.Fatal(err)
	}
	newSum := sum(newer)
	d.Stop()
	d.Start("--agent-binary", newer)

	if _, err := d.C.Wake(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
	if got := inside("sleeper"); got != oldSum {
		t.Errorf("woken after the upgrade, the sleeper runs agent %s, want its own %s", got, oldSum)
	}
	if got := strings.TrimSpace(d.Run("sleeper", "cat", "/dev/shm/mem")); got != "before" {
		t.Errorf("woken sleeper's memory: %q", got)
	}
	if _, err := d.C.ForkWith(ctx, "source", cp.ID, api.CreateSandbox{Name: "fork"}); err != nil {
		t.Fatal(err)
	}
	if got := inside("fork"); got != oldSum {
		t.Errorf("a fork of a checkpoint from before the upgrade runs agent %s, want %s", got, oldSum)
	}
	if _, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "fresh"}); err != nil {
		t.Fatal(err)
	}
	if got := inside("fresh"); got != newSum {
		t.Errorf("a new sandbox runs agent %s, want the new %s", got, newSum)
	}
}
