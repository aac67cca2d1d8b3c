package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/test/harness"
)

// TestClusterWakeAnywhere: a sandbox asleep on node b, whose image b
// stored, does not pin b. With b killed, the first exec through a takes it
// over and wakes it there from that image: the same id, name and URL,
// its process and files as they slept, nothing lost; a restore of a
// stored checkpoint is not needed. b, back, destroys its stale copy and
// leaves a's alone. Woken and asleep again on a, it wakes on a from its
// new image, never from the one b stored.
func TestClusterWakeAnywhere(t *testing.T) {
	t.Parallel()
	nodes := objectNodes(t, "wake/", "a", "b")
	a, b := nodes[0], nodes[1]
	ctx := harness.Ctx(t)
	made, pid := markedSandbox(t, a, "nap", "b", "dreaming", api.CreateSandbox{})
	if _, err := a.C.Sleep(ctx, "nap"); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "b storing nap's sleep image", func() error {
		if !strings.Contains(b.Log.String(), "sleep image stored") {
			return fmt.Errorf("not in b's log yet")
		}
		return nil
	})
	b.Kill()
	harness.Eventually(t, 20*time.Second, "b seen gone", func() error {
		if sb, err := a.C.GetSandbox(ctx, "nap"); err != nil || sb.State != api.StateUnknown {
			return fmt.Errorf("nap: %+v, %v", sb, err)
		}
		return nil
	})
	start := time.Now()
	got := a.Run("nap", "sh", "-c", "cat /home/loam/mark; pidof sleep")
	t.Logf("woken on a from b's stored sleep image, b gone: %v until the first exec answered", time.Since(start).Round(time.Millisecond))
	if got != "dreaming\n"+pid+"\n" {
		t.Errorf("nap woken on a: %q, want its mark and its sleep (pid %s) as it slept", got, pid)
	}
	sb, err := a.C.GetSandbox(ctx, "nap")
	if err != nil || sb.ID != made.ID || sb.URL != made.URL || sb.Node != "a" || sb.State != api.StateRunning || sb.Reason != "" {
		t.Fatalf("nap once woken through a: %+v, %v; want id %s url %s, running on a, no reason", sb, err, made.ID, made.URL)
	}
	if !strings.Contains(a.Log.String(), "took over a sleeping sandbox to wake it here") {
		t.Errorf("a's log does not say it took nap over")
	}

	// Asleep again on a, and woken: from a's image, with what it did on a.
	a.Run("nap", "sh", "-c", "echo awake-on-a > /home/loam/mark")
	if _, err := a.C.Sleep(ctx, "nap"); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(a.Run("nap", "cat", "/home/loam/mark")); got != "awake-on-a" {
		t.Errorf("nap woken on a again: mark %q", got)
	}

	// A crash that takes a's own copy of the image (as one after a
	// takeover, before the image was in place) loses nothing: a,
	// restarted, fetches the stored image again.
	storedBefore := strings.Count(a.Log.String(), "sleep image stored")
	if _, err := a.C.Sleep(ctx, "nap"); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "a storing nap's sleep image", func() error {
		if strings.Count(a.Log.String(), "sleep image stored") <= storedBefore {
			return fmt.Errorf("not in a's log yet")
		}
		return nil
	})
	a.KillSettled()
	if err := os.RemoveAll(filepath.Join(a.DataDir, "sandboxes", made.ID, "sleep")); err != nil {
		t.Fatal(err)
	}
	a.Start(a.args...)
	harness.Eventually(t, time.Minute, "a fetching nap's image again", func() error {
		if !strings.Contains(a.Log.String(), "fetched it again from the object store") {
			return fmt.Errorf("not in a's log yet")
		}
		return nil
	})
	if got := a.Run("nap", "sh", "-c", "cat /home/loam/mark; pidof sleep"); got != "awake-on-a\n"+pid+"\n" {
		t.Errorf("nap woken on a after its image there was lost: %q, want its mark and its sleep (pid %s)", got, pid)
	}

	b.Start(b.args...)
	harness.Eventually(t, time.Minute, "b destroying its stale copy", func() error {
		if !strings.Contains(b.Log.String(), "destroying the stale copy of a sandbox another node owns now") {
			return fmt.Errorf("not in b's log yet")
		}
		return nil
	})
	if got := a.Run("nap", "sh", "-c", "cat /home/loam/mark; pidof sleep"); got != "awake-on-a\n"+pid+"\n" {
		t.Errorf("nap on a once b is back: %q, want it untouched", got)
	}
	if got, _, _, err := b.C.Output(ctx, "nap", "cat", "/home/loam/mark"); err != nil || strings.TrimSpace(string(got)) != "awake-on-a" {
		t.Errorf("an exec in nap through b: %q, %v; want it passed to a", got, err)
	}
	if err := b.C.DeleteSandbox(ctx, "nap"); err != nil {
		t.Errorf("deleting nap through b: %v", err)
	}
}
