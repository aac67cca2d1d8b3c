package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/internal/network"
)

// TestCrashPoints kills the daemon (SIGKILL) at every named crash point
// (internal/crash) in turn, on one data dir and one daemon binary built
// with -tags crashpoints, and checks after each restart that the sandbox
// the operation was on is as it was before the operation or as after it;
// that every listed checkpoint has its data, the new ones restore (a fork
// of each is checked), and no id is handed out twice; and that nothing
// leaked: files, disk volumes and snapshots, mounts, loop devices, network
// namespaces, veths, firewall chains, runsc containers and cgroups.
//
// The daemon is armed through a file (LOAM_CRASH_AT=@file) just before the
// operation, and disarmed before it starts again, so one start serves both
// the recovery of a point and the operation of the next.
func TestCrashPoints(t *testing.T) {
	start := time.Now()
	bin := filepath.Join(t.TempDir(), "loam-crashpoints")
	build := exec.Command("go", "build", "-tags", "crashpoints", "-o", bin, "loam.dev/loam/cmd/loam")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building loam with crash points: %v\n%s", err, out)
	}
	t.Logf("built loam with crash points in %v", time.Since(start).Round(time.Millisecond))
	checkReleaseBinary(t, bin)

	c := newCrasher(t, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c.ctx = ctx

	// The sandbox most points act on: its disk says d1 and its memory (a
	// tmpfs, which only a memory checkpoint keeps) says m1; checkpoint
	// mem holds d0/m0 with its memory, disk d0 without.
	if _, err := c.d.C.CreateSandbox(c.ctx, api.CreateSandbox{Name: "main",
		Services: []api.Service{{Name: "counter", Cmd: []string{"sh", "-c", counterScript}}}}); err != nil {
		t.Fatal(err)
	}
	c.mark(t, "main", "d0", "m0")
	memCP := c.checkpoint(t, "main", true)
	diskCP := c.checkpoint(t, "main", false)
	c.mark(t, "main", "d1", "m1")
	c.baseline(t)
	t.Logf("prepared in %v", time.Since(start).Round(time.Millisecond))

	covered := map[string]bool{}
	// run runs the case of a point; a point with more than one case names
	// the others POINT@WHAT.
	run := func(point string, f func(t *testing.T)) {
		base, _, _ := strings.Cut(point, "@")
		covered[base] = true
		t.Run(point, func(t *testing.T) {
			began := time.Now()
			f(t)
			// The start-up that recovered says what it removed.
			for _, line := range recoveryLogs[point] {
				if !strings.Contains(c.d.log.String(), line) {
					t.Errorf("the recovery after %s did not log %q", point, line)
				}
			}
			c.checkAll(t)
			t.Logf("%s: %v", point, time.Since(began).Round(time.Millisecond))
			if t.Failed() {
				t.Logf("log of the run that crashed:\n%s\nlog of the run that recovered:\n%s", c.crashLog, c.d.log.String())
			}
		})
	}

	// Create, with a service: no sandbox, or one running its service.
	for _, p := range []string{"create.stored", "boot.disk", "prepare.netns", "prepare.policy", "boot.started",
		"boot.connected", "create.services"} {
		run(p, func(t *testing.T) {
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "new",
					Services: []api.Service{{Name: "svc", Cmd: []string{"sleep", "100000"}}}})
				return err
			})
			if _, err := c.d.C.GetSandbox(c.ctx, "new"); err == nil {
				svcs, err := c.d.C.ListServices(c.ctx, "new")
				if err != nil || len(svcs) != 1 || svcs[0].Name != "svc" {
					t.Errorf("the sandbox made has services %+v, %v; want svc", svcs, err)
				}
			}
			c.beforeOrAfterCreate(t, "new", "", "")
		})
	}

	// Memory and disk-only checkpoints of a running sandbox: it runs on,
	// memory and all, and its list is as before or has one more.
	for _, p := range []string{"checkpoint.numbered", "checkpoint.image", "checkpoint.snapshot", "checkpoint.frozen",
		"token.stored", "checkpoint.synced", "checkpoint.renamed", "checkpoint.disk-snapshot"} {
		run(p, func(t *testing.T) {
			memory := p != "checkpoint.disk-snapshot"
			before := c.listCPs(t, "main")
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.CreateCheckpoint(ctx, "main", api.CreateCheckpoint{Memory: &memory})
				return err
			})
			c.expectFacts(t, "main", "d1|m1")
			c.newCheckpoints(t, "main", before, "d1|m1")
			c.nextIDIsNew(t, "main")
		})
	}

	// A memory checkpoint of a sleeping sandbox (its sleep image, linked):
	// asleep as before, and woken it has its memory.
	run("checkpoint.asleep", func(t *testing.T) {
		if _, err := c.d.C.Sleep(c.ctx, "main"); err != nil {
			t.Fatal(err)
		}
		before := c.listCPs(t, "main")
		c.crash(t, "checkpoint.asleep", func(ctx context.Context) error {
			_, err := c.d.C.CreateCheckpoint(ctx, "main", api.CreateCheckpoint{})
			return err
		})
		if st := c.state(t, "main"); st != api.StateSleeping {
			t.Errorf("state %s after a checkpoint of a sleeping sandbox was cut short, want sleeping", st)
		}
		c.newCheckpoints(t, "main", before, "d1|m1")
		c.expectFacts(t, "main", "d1|m1")
		c.nextIDIsNew(t, "main")
	})

	// A checkpoint's delete: listed and whole, or gone with its data.
	run("checkpoint-delete.record", func(t *testing.T) {
		id := c.checkpoint(t, "main", false)
		c.crash(t, "checkpoint-delete.record", func(ctx context.Context) error {
			return c.d.C.DeleteCheckpoint(ctx, "main", id)
		})
		if cps := c.listCPs(t, "main"); slices.ContainsFunc(cps, func(cp api.Checkpoint) bool { return cp.ID == id }) {
			t.Logf("%s is still listed (before the delete)", id)
			c.forkCheck(t, "main", id, "d1|none")
			c.deleteCP(t, "main", id)
		}
	})

	// Restore in place to the memory checkpoint: as before (d1/m1, the
	// same checkpoints), or restored (d0/m0, with one automatic
	// checkpoint more that holds d1/m1). A crash after the checkpoint that
	// keeps the state stopped the sandbox, and before that checkpoint is
	// stored, loses its memory: it boots again on its untouched disk.
	for _, p := range []string{"restore.numbered", "restore.auto-image", "restore.auto-gen", "restore.auto-kept",
		"restore.restoring", "rollback.stopped", "rollback.disk-dropped", "rollback.disk-back",
		"resume.restored", "resume.connected"} {
		run(p, func(t *testing.T) {
			before := c.listCPs(t, "main")
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.RestoreCheckpoint(ctx, "main", memCP)
				return err
			})
			got := c.facts(t, "main")
			after := c.listCPs(t, "main")
			switch {
			case got == "d1|m1" && len(after) == len(before):
				t.Logf("before the restore")
			case got == "d0|m0" && len(after) == len(before)+1:
				t.Logf("restored")
				c.newCheckpoints(t, "main", before, "d1|m1")
				c.mark(t, "main", "d1", "m1")
			case got == "d1|none" && len(after) == len(before) && (p == "restore.auto-image" || p == "restore.auto-gen"):
				t.Logf("booted again on its disk: the memory was in the automatic checkpoint cut short")
				c.mark(t, "main", "d1", "m1")
			default:
				t.Errorf("after the crash: disk|memory %q with %d checkpoints (%d before): neither before nor after the restore", got, len(after), len(before))
			}
			c.pruneAutos(t, "main")
		})
	}

	// The same of a sleeping sandbox, whose state is its sleep image: it
	// stays asleep as before, or is restored.
	for _, p := range []string{"restore.numbered", "restore.auto-kept"} {
		run(p+"@asleep", func(t *testing.T) {
			if _, err := c.d.C.Sleep(c.ctx, "main"); err != nil {
				t.Fatal(err)
			}
			before := c.listCPs(t, "main")
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.RestoreCheckpoint(ctx, "main", memCP)
				return err
			})
			st := c.state(t, "main")
			after := c.listCPs(t, "main")
			got := c.facts(t, "main")
			switch {
			case st == api.StateSleeping && got == "d1|m1" && len(after) == len(before):
				t.Logf("asleep, before the restore")
			case st == api.StateRunning && got == "d0|m0" && len(after) == len(before)+1:
				t.Logf("restored")
				c.newCheckpoints(t, "main", before, "d1|m1")
				c.mark(t, "main", "d1", "m1")
			default:
				t.Errorf("after the crash: %s, disk|memory %q with %d checkpoints (%d before): neither before nor after the restore", st, got, len(after), len(before))
			}
			c.pruneAutos(t, "main")
		})
	}

	run("fork.stored", func(t *testing.T) {
		c.crash(t, "fork.stored", func(ctx context.Context) error {
			_, err := c.d.C.Fork(ctx, "main", memCP, "forked")
			return err
		})
		c.beforeOrAfterCreate(t, "forked", "d0|m0", "")
	})
	run("fork.disk", func(t *testing.T) {
		c.crash(t, "fork.disk", func(ctx context.Context) error {
			_, err := c.d.C.Fork(ctx, "main", diskCP, "forked")
			return err
		})
		c.beforeOrAfterCreate(t, "forked", "d0|none", "")
	})

	// Sleep: running as before, or asleep; woken, it has its memory. A
	// crash after the checkpoint that writes the image stopped it, and
	// before the image is durable, loses its memory.
	for _, p := range []string{"sleep.image", "sleep.durable", "sleep.deleted"} {
		run(p, func(t *testing.T) {
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.Sleep(ctx, "main")
				return err
			})
			st := c.state(t, "main")
			t.Logf("after the crash: %s", st)
			if st != api.StateRunning && st != api.StateSleeping {
				t.Fatalf("state %s, want running or sleeping", st)
			}
			got := c.facts(t, "main") // wakes it
			switch {
			case got == "d1|m1":
			case got == "d1|none" && st == api.StateRunning && p == "sleep.image":
				t.Logf("booted again on its disk: the sleep image was not durable")
				c.mark(t, "main", "d1", "m1")
			default:
				t.Errorf("disk|memory %q, want d1|m1", got)
			}
		})
	}

	// Wake: asleep as before, or awake; either way it has its memory.
	for _, p := range []string{"wake.numbered", "wake.restored", "wake.connected", "wake.image-dropped"} {
		run(p, func(t *testing.T) {
			if _, err := c.d.C.Sleep(c.ctx, "main"); err != nil {
				t.Fatal(err)
			}
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.Wake(ctx, "main")
				return err
			})
			st := c.state(t, "main")
			t.Logf("after the crash: %s", st)
			if st != api.StateRunning && st != api.StateSleeping {
				t.Fatalf("state %s, want running or sleeping", st)
			}
			c.expectFacts(t, "main", "d1|m1")
		})
	}

	// Network policy: the old or the new, applied.
	run("network.stored", func(t *testing.T) {
		c.crash(t, "network.stored", func(ctx context.Context) error {
			_, err := c.d.C.SetNetwork(ctx, "main", api.NetworkPolicy{Egress: api.EgressNone, Allow: []string{"192.0.2.1"}})
			return err
		})
		sb, err := c.d.C.GetSandbox(c.ctx, "main")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("egress after the crash: %s", sb.Network.Egress)
		chain := c.nftChain(t, "main")
		if hasAllow := strings.Contains(chain, "192.0.2.1"); hasAllow != (sb.Network.Egress == api.EgressNone) {
			t.Errorf("the firewall does not apply the policy the record says (%+v):\n%s", sb.Network, chain)
		}
		if _, err := c.d.C.SetNetwork(c.ctx, "main", api.NetworkPolicy{Egress: api.EgressAll}); err != nil {
			t.Fatal(err)
		}
	})

	// Templates from a checkpoint: none, or one whose sandboxes work.
	for _, p := range []string{"template.volume", "template.filled", "template.synced"} {
		run(p, func(t *testing.T) {
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.CreateTemplate(ctx, "crashtpl", "main", memCP)
				return err
			})
			if c.hasTemplate(t, "crashtpl") {
				t.Logf("the template was made")
				c.create(t, "from-tpl", "crashtpl")
				c.expectFacts(t, "from-tpl", "d0|m0")
				c.delete(t, "from-tpl")
				if err := c.d.C.DeleteTemplate(c.ctx, "crashtpl"); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	for _, p := range []string{"template-sandbox.stored", "template-sandbox.disk"} {
		run(p, func(t *testing.T) {
			if !c.hasTemplate(t, "crashtpl") {
				if _, err := c.d.C.CreateTemplate(c.ctx, "crashtpl", "main", memCP); err != nil {
					t.Fatal(err)
				}
			}
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "from-tpl", Template: "crashtpl"})
				return err
			})
			c.beforeOrAfterCreate(t, "from-tpl", "d0|m0", "crashtpl")
		})
	}
	run("template-delete.renamed", func(t *testing.T) {
		c.crash(t, "template-delete.renamed", func(ctx context.Context) error {
			return c.d.C.DeleteTemplate(ctx, "crashtpl")
		})
		if c.hasTemplate(t, "crashtpl") {
			t.Errorf("template crashtpl is listed after its delete was cut short after its rename")
		}
	})

	// Warm pool claim: no sandbox, or one that knows its name.
	run("pool.claimed", func(t *testing.T) {
		if _, err := c.d.C.SetTemplatePool(c.ctx, "busybox", 1); err != nil {
			t.Fatal(err)
		}
		c.waitPool(t, 1)
		c.crash(t, "pool.claimed", func(ctx context.Context) error {
			_, err := c.d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "pooled"})
			return err
		})
		// Refilled after the restart (the members a daemon leaves are
		// deleted at the next start); drained once no member is being made.
		c.waitPool(t, 1)
		if _, err := c.d.C.SetTemplatePool(c.ctx, "busybox", 0); err != nil {
			t.Fatal(err)
		}
		c.waitPool(t, 0)
		if sb, err := c.d.C.GetSandbox(c.ctx, "pooled"); err == nil {
			t.Logf("claimed: %s", sb.State)
			if out := c.out(t, "pooled", "hostname"); strings.TrimSpace(out) != "pooled" {
				t.Errorf("hostname %q, want pooled", out)
			}
			c.delete(t, "pooled")
		}
	})

	// Delete: gone, with all it had; a delete is never left half done.
	for _, p := range []string{"delete.marked", "destroy.container", "destroy.network", "destroy.disk", "destroy.checkpoints", "destroy.dirs"} {
		run(p, func(t *testing.T) {
			c.create(t, "doomed")
			c.checkpoint(t, "doomed", false)
			c.crash(t, p, func(ctx context.Context) error {
				return c.d.C.DeleteSandbox(ctx, "doomed")
			})
			if sb, err := c.d.C.GetSandbox(c.ctx, "doomed"); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("after a delete cut short: %+v, %v; want not found", sb, err)
			}
		})
	}

	// Image pulls: each of a new image, so that it is unpacked and
	// imported afresh. A pull goes on after the call returns: after the
	// restart it is ready.
	reg := imagetest.Registry(t, "", "")
	for _, p := range []string{"image.recorded", "image.described", "cache.built", "cache.imported"} {
		run(p, func(t *testing.T) {
			ref := reg + "/crash/" + strings.ReplaceAll(p, ".", "-") + ":v1"
			imagetest.Push(t, ref, imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin"}}, imagetest.Busybox(t),
				imagetest.Layer(t, imagetest.Entry{Name: "etc/crash-point", Body: []byte(p + " " + randHex())})), "", "")
			c.crash(t, p, func(ctx context.Context) error {
				if _, err := c.d.C.PullImage(ctx, ref); err != nil {
					return err
				}
				_, err := c.d.C.WaitImage(ctx, image.ID(ref), 50*time.Millisecond, nil)
				return err
			})
			im, err := c.d.C.WaitImage(c.ctx, image.ID(ref), 100*time.Millisecond, nil)
			if err != nil || im.State != api.ImageReady {
				t.Fatalf("after the crash the image is %+v, %v; want it pulled", im, err)
			}
			if p == "cache.imported" {
				// One sandbox of an image pulled across a crash.
				sb, err := c.d.C.CreateSandbox(c.ctx, api.CreateSandbox{Name: "of-image", Image: ref})
				if err != nil {
					t.Fatal(err)
				}
				if out := c.out(t, sb.Name, "cat", "/etc/crash-point"); !strings.HasPrefix(out, p+" ") {
					t.Errorf("the image's file says %q", out)
				}
				c.delete(t, sb.Name)
			}
			if err := c.d.C.DeleteImage(c.ctx, im.ID); err != nil {
				t.Fatal(err)
			}
		})
	}

	// An image's delete: gone, and its template with it.
	run("image-delete.record", func(t *testing.T) {
		ref := reg + "/crash/delete:v1"
		imagetest.Push(t, ref, imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin"}}, imagetest.Busybox(t),
			imagetest.Layer(t, imagetest.Entry{Name: "etc/crash-point", Body: []byte(randHex())})), "", "")
		if _, err := c.d.C.PullImage(c.ctx, ref); err != nil {
			t.Fatal(err)
		}
		im, err := c.d.C.WaitImage(c.ctx, image.ID(ref), 50*time.Millisecond, nil)
		if err != nil || im.State != api.ImageReady {
			t.Fatalf("pulling %s: %+v, %v", ref, im, err)
		}
		c.crash(t, "image-delete.record", func(ctx context.Context) error {
			return c.d.C.DeleteImage(ctx, im.ID)
		})
		if got, err := c.d.C.GetImage(c.ctx, im.ID); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("after its delete was cut short, image %s is %+v, %v; want not found", ref, got, err)
		}
		// Its unpacked tree stays in the cache this host's daemons share
		// (see image.Service.Sweep): not the test's to leave there.
		hex := strings.TrimPrefix(im.Digest, "sha256:")
		trees, _ := filepath.Glob(filepath.Join(templateCache(), "images", "image-"+hex[:16]+"-*"))
		for _, tree := range trees {
			if err := os.RemoveAll(tree); err != nil {
				t.Error(err)
			}
		}
	})

	for _, p := range crash.Points {
		if !covered[p] {
			t.Errorf("crash point %s is crossed by no case of this test", p)
		}
	}
	// Every checkpoint of the sandbox the points took turns on restores,
	// with its data.
	for _, cp := range c.listCPs(t, "main") {
		if _, err := c.d.C.RestoreCheckpoint(c.ctx, "main", cp.ID); err != nil {
			t.Errorf("restoring %s: %v", cp.ID, err)
			continue
		}
		want := map[string]string{memCP: "d0|m0", diskCP: "d0|none"}[cp.ID]
		if got := c.facts(t, "main"); want != "" && got != want {
			t.Errorf("restored to %s: disk|memory %q, want %q", cp.ID, got, want)
		}
	}
	c.checkAll(t)
	t.Logf("%d crash points in %v", len(crash.Points), time.Since(start).Round(time.Millisecond))
}

// counterScript counts in memory and on disk: a sandbox whose memory and
// disk come from two moments (a memory image restored onto a disk written
// after it) finds the disk ahead of its memory, and says so in
// /home/loam/inconsistent. A fresh boot starts from the disk.
const counterScript = `f=/home/loam/counter; n=$(cat $f 2>/dev/null || echo 0)
while :; do
  d=$(cat $f 2>/dev/null || echo 0)
  if [ "$d" -gt "$n" ]; then echo "memory $n, disk $d" >> /home/loam/inconsistent; n=$d; fi
  n=$((n+1)); echo $n > $f.tmp && mv $f.tmp $f; sleep 0.02
done`

// recoveryLogs are lines the start-up after a crash at a point logs: one
// for each kind of leftover that point leaves, as it removes it.
var recoveryLogs = map[string][]string{
	"create.stored":            {"finishing interrupted operation"},
	"boot.disk":                {"finishing interrupted operation"},
	"boot.started":             {"finishing interrupted operation"},
	"checkpoint.image":         {"resuming sandbox left paused", "removing unfinished checkpoint data"},
	"checkpoint.snapshot":      {"resuming sandbox left paused", "removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint.synced":        {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint.renamed":       {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint.disk-snapshot": {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint.asleep":        {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint-delete.record": {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"restore.auto-gen":         {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"restore.auto-kept":        {"finishing it"},
	"rollback.disk-dropped":    {"finishing interrupted restore", "removing orphaned disk"},
	"fork.disk":                {"finishing interrupted operation"},
	"sleep.durable":            {"finishing interrupted sleep"},
	"wake.restored":            {"finishing interrupted wake"},
	"template.volume":          {"removing unfinished template data", "removing orphaned disk"},
	"template.filled":          {"removing unfinished template data", "removing unfinished template snapshot"},
	"template-delete.renamed":  {"removing unfinished template data", "removing unfinished template snapshot"},
	"destroy.container":        {"finishing interrupted operation"},
	"image-delete.record":      {"removing the template of an image that is gone"},
}

// checkReleaseBinary checks that the release build (loamBin, built without
// the tag) carries neither the variable that arms crash points nor their
// names, while the build with the tag carries both.
func checkReleaseBinary(t *testing.T, withPoints string) {
	rel, err := os.ReadFile(loamBin)
	if err != nil {
		t.Fatal(err)
	}
	with, err := os.ReadFile(withPoints)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append([]string{"LOAM_CRASH_AT"}, crash.Points...) {
		if bytes.Contains(rel, []byte(s)) {
			t.Errorf("the release binary holds %q", s)
		}
		if !bytes.Contains(with, []byte(s)) {
			t.Errorf("the crashpoints binary lacks %q", s)
		}
	}
}

func randHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// crasher runs one daemon with crash points and checks it after each crash.
type crasher struct {
	d   *daemon
	ctx context.Context
	arm string
	// logs is every log of the daemon's runs but the current one: the
	// sandbox ids they name are the ones whose leftovers are looked for.
	logs strings.Builder
	// crashLog is the log of the run that crashed last.
	crashLog string
	// seen is every checkpoint id ever listed, per sandbox id.
	seen map[string]map[string]bool
	// mounts and loops are the host's, as the prepared daemon has them.
	mounts []string
	loops  int
}

func newCrasher(t *testing.T, bin string) *crasher {
	arm := filepath.Join(t.TempDir(), "crash-at")
	if err := os.WriteFile(arm, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir, err := os.MkdirTemp("", "loam-e2e-crash-")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, dataDir: dataDir, subnet: nextSubnet(), bin: bin, env: []string{"LOAM_CRASH_AT=@" + arm}}
	d.start()
	t.Cleanup(func() { d.destroy() })
	return &crasher{d: d, arm: arm, seen: map[string]map[string]bool{}}
}

// crash arms point, runs op, and waits for the daemon to die there; then
// it disarms it and starts the daemon again, which recovers.
func (c *crasher) crash(t *testing.T, point string, op func(ctx context.Context) error) {
	t.Helper()
	if err := os.WriteFile(c.arm, []byte(point), 0o644); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	cmd := c.d.cmd
	go func() { _ = cmd.Wait(); close(exited) }()
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	opErr := make(chan error, 1)
	go func() { opErr <- op(ctx) }()
	var err error
	reached := false
	select {
	case <-exited:
		reached = true
	case err = <-opErr:
		select {
		case <-exited:
			reached = true
		case <-time.After(30 * time.Second):
		}
	case <-time.After(2 * time.Minute):
	}
	if !reached {
		_ = cmd.Process.Kill()
		<-exited
	}
	if werr := os.WriteFile(c.arm, nil, 0o644); werr != nil {
		t.Fatal(werr)
	}
	log := c.d.log.String()
	c.logs.WriteString(log)
	c.crashLog = log
	c.d.cmd = nil
	if err := c.d.launch(); err != nil {
		t.Fatalf("starting again after the crash at %s: %v", point, err)
	}
	if !reached || !strings.Contains(log, "crash point "+point+":") {
		t.Fatalf("the daemon did not die at %s (the operation returned %v)", point, err)
	}
}

func (c *crasher) create(t *testing.T, name string, template ...string) {
	t.Helper()
	req := api.CreateSandbox{Name: name}
	if len(template) > 0 {
		req.Template = template[0]
	}
	if _, err := c.d.C.CreateSandbox(c.ctx, req); err != nil {
		t.Fatal(err)
	}
}

func (c *crasher) delete(t *testing.T, name string) {
	t.Helper()
	if err := c.d.C.DeleteSandbox(c.ctx, name); err != nil {
		t.Fatal(err)
	}
}

func (c *crasher) out(t *testing.T, name string, cmd ...string) string {
	t.Helper()
	return c.d.runB(t, name, cmd...)
}

// mark writes disk into the sandbox's disk and mem into its memory.
func (c *crasher) mark(t *testing.T, name, disk, mem string) {
	t.Helper()
	c.out(t, name, "sh", "-c", fmt.Sprintf("printf %s > /home/loam/disk && printf %s > /dev/shm/mem && sync", disk, mem))
}

// facts is "DISK|MEM" as the sandbox has them (MEM "none" when its memory
// was lost); it wakes a sleeping sandbox.
func (c *crasher) facts(t *testing.T, name string) string {
	t.Helper()
	out := c.out(t, name, "sh", "-c", "cat /home/loam/disk; printf '|'; cat /dev/shm/mem 2>/dev/null || printf none")
	return strings.TrimSpace(out)
}

func (c *crasher) expectFacts(t *testing.T, name, want string) {
	t.Helper()
	if got := c.facts(t, name); got != want {
		t.Errorf("%s: disk|memory %q, want %q", name, got, want)
	}
}

func (c *crasher) state(t *testing.T, name string) api.State {
	t.Helper()
	sb, err := c.d.C.GetSandbox(c.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return sb.State
}

func (c *crasher) checkpoint(t *testing.T, name string, memory bool) string {
	t.Helper()
	cp, err := c.d.C.CreateCheckpoint(c.ctx, name, api.CreateCheckpoint{Memory: &memory})
	if err != nil {
		t.Fatal(err)
	}
	c.sawCP(t, name, cp.ID)
	return cp.ID
}

func (c *crasher) deleteCP(t *testing.T, name, id string) {
	t.Helper()
	if err := c.d.C.DeleteCheckpoint(c.ctx, name, id); err != nil {
		t.Fatal(err)
	}
}

func (c *crasher) listCPs(t *testing.T, name string) []api.Checkpoint {
	t.Helper()
	cps, err := c.d.C.ListCheckpoints(c.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return cps
}

// sawCP records a checkpoint id handed out for the first time; one seen
// before is an id handed out twice.
func (c *crasher) sawCP(t *testing.T, name, id string) {
	t.Helper()
	sb := c.id(t, name)
	if c.seen[sb] == nil {
		c.seen[sb] = map[string]bool{}
	}
	if c.seen[sb][id] {
		t.Errorf("checkpoint id %s of %s was handed out before", id, name)
	}
	c.seen[sb][id] = true
}

// id is sandbox name's id.
func (c *crasher) id(t *testing.T, name string) string {
	t.Helper()
	sb, err := c.d.C.GetSandbox(c.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

// newCheckpoints checks the checkpoints listed now that were not before:
// at most one, with an id never seen, that forks into want.
func (c *crasher) newCheckpoints(t *testing.T, name string, before []api.Checkpoint, want string) {
	t.Helper()
	var added []api.Checkpoint
	for _, cp := range c.listCPs(t, name) {
		if !slices.ContainsFunc(before, func(b api.Checkpoint) bool { return b.ID == cp.ID }) {
			added = append(added, cp)
		}
	}
	if len(added) > 1 {
		t.Errorf("%d new checkpoints after one operation: %+v", len(added), added)
	}
	for _, cp := range added {
		t.Logf("new checkpoint %s (memory %v)", cp.ID, cp.Memory)
		c.sawCP(t, name, cp.ID)
		if !cp.Memory {
			want = strings.Split(want, "|")[0] + "|none"
		}
		c.forkCheck(t, name, cp.ID, want)
	}
}

// forkCheck forks checkpoint id and checks the fork's disk and memory.
func (c *crasher) forkCheck(t *testing.T, name, id, want string) {
	t.Helper()
	if _, err := c.d.C.Fork(c.ctx, name, id, "check-fork"); err != nil {
		t.Fatalf("forking %s: %v", id, err)
	}
	c.expectFacts(t, "check-fork", want)
	c.delete(t, "check-fork")
}

// nextIDIsNew takes a checkpoint and checks that its id is one never seen
// (an id spent by the operation cut short is not handed out again), then
// deletes it.
func (c *crasher) nextIDIsNew(t *testing.T, name string) {
	t.Helper()
	high := 0
	for id := range c.seen[c.id(t, name)] {
		if n, err := strconv.Atoi(strings.TrimPrefix(id, "v")); err == nil {
			high = max(high, n)
		}
	}
	id := c.checkpoint(t, name, false)
	n, _ := strconv.Atoi(strings.TrimPrefix(id, "v"))
	// The operation cut short had spent high+1.
	if n < high+2 {
		t.Errorf("new checkpoint %s after a checkpoint cut short; the highest seen was v%d, so v%d was spent", id, high, high+1)
	}
	c.deleteCP(t, name, id)
}

// pruneAutos deletes the automatic checkpoints, so that they do not pile up.
func (c *crasher) pruneAutos(t *testing.T, name string) {
	t.Helper()
	for _, cp := range c.listCPs(t, name) {
		if cp.Auto {
			c.deleteCP(t, name, cp.ID)
		}
	}
}

// beforeOrAfterCreate checks a create cut short: no sandbox name, or one
// running with disk|memory want (when given); the one made is deleted.
func (c *crasher) beforeOrAfterCreate(t *testing.T, name, want, template string) {
	t.Helper()
	sb, err := c.d.C.GetSandbox(c.ctx, name)
	if errors.Is(err, api.ErrNotFound) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s was made: %s", name, sb.State)
	if sb.State != api.StateRunning {
		t.Errorf("%s is %s after a create cut short, want running or none", name, sb.State)
	}
	if want != "" {
		c.expectFacts(t, name, want)
	} else {
		c.out(t, name, "true")
	}
	c.delete(t, name)
}

func (c *crasher) hasTemplate(t *testing.T, name string) bool {
	t.Helper()
	tpls, err := c.d.C.Templates(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(tpls, func(tp api.Template) bool { return tp.Name == name })
}

// waitPool waits until the busybox pool has want members ready, and no
// member is left beyond them on disk.
func (c *crasher) waitPool(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		p, err := c.d.C.TemplatePool(c.ctx, "busybox")
		if err != nil {
			t.Fatal(err)
		}
		sbs, err := c.d.C.ListSandboxes(c.ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dirs := dirNamesOf(filepath.Join(c.d.dataDir, "sandboxes"))
		if p.Ready == want && p.Starting == 0 && len(dirs) == len(sbs)+want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool has %+v, %d sandbox dirs for %d sandboxes; want %d ready", p, len(dirs), len(sbs), want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nftChain is the firewall chain of sandbox name's address, which its
// handle (DATA_DIR/sandboxes/ID/handle.json) says.
func (c *crasher) nftChain(t *testing.T, name string) string {
	t.Helper()
	sb, err := c.d.C.GetSandbox(c.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(c.d.dataDir, "sandboxes", sb.ID, "handle.json"))
	var h struct {
		SandboxIP string `json:"sandbox_ip"`
	}
	if err == nil {
		err = json.Unmarshal(b, &h)
	}
	if err != nil || h.SandboxIP == "" {
		t.Fatalf("reading the handle of %s: %v", name, err)
	}
	ch := "sb_" + strings.ReplaceAll(h.SandboxIP, ".", "_")
	out, err := exec.Command("nft", "list", "chain", "ip", c.table(), ch).CombinedOutput()
	if err != nil {
		t.Fatalf("listing chain %s: %v\n%s", ch, err, out)
	}
	return string(out)
}

func (c *crasher) table() string {
	return network.TableName(netip.MustParsePrefix(c.d.subnet))
}

// nftChains lists the per-sandbox chains (sb_ADDRESS) of the daemon's table.
func (c *crasher) nftChains(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", "ip", c.table()).Output()
	if err != nil {
		t.Fatalf("listing firewall %s: %v", c.table(), err)
	}
	var chains []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "chain" && strings.HasPrefix(f[1], "sb_") {
			chains = append(chains, f[1])
		}
	}
	return chains
}

// baseline records the host's mounts and loop devices of the prepared
// daemon: every later inventory must match.
func (c *crasher) baseline(t *testing.T) {
	c.mounts = mountsUnder(c.d.dataDir)
	c.loops = loopsOf(c.d.dataDir)
	c.checkAll(t)
}

// checkAll checks what every recovery must leave: sandboxes running or
// asleep, every listed checkpoint whole, and nothing on the host that no
// record accounts for.
func (c *crasher) checkAll(t *testing.T) {
	t.Helper()
	sbs, err := c.d.C.ListSandboxes(c.ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data := c.d.dataDir
	ids, running := map[string]bool{}, map[string]bool{}
	var snaps []string
	cpDirs := map[string][]string{}
	for _, sb := range sbs {
		ids[sb.ID] = true
		switch sb.State {
		case api.StateRunning:
			running[sb.ID] = true
			if out := c.out(t, sb.Name, "sh", "-c", "cat /home/loam/inconsistent 2>/dev/null; true"); out != "" {
				t.Errorf("%s runs with a memory older than its disk: %s", sb.Name, out)
			}
		case api.StateSleeping:
		default:
			t.Errorf("sandbox %s is %s after recovery", sb.Name, sb.State)
		}
		_, err := os.Stat(filepath.Join(data, "sandboxes", sb.ID, "sleep"))
		if (err == nil) != (sb.State == api.StateSleeping) {
			t.Errorf("sandbox %s is %s, and its sleep dir: %v", sb.Name, sb.State, err)
		}
		if _, err := os.Stat(filepath.Join(data, "sandboxes", sb.ID, ".sleep-dropped")); err == nil {
			t.Errorf("sandbox %s keeps a dropped sleep image", sb.Name)
		}
		for _, cp := range c.listCPs(t, sb.Name) {
			c.seen[sb.ID] = mapOr(c.seen[sb.ID])
			c.seen[sb.ID][cp.ID] = true
			dir := filepath.Join(data, "checkpoints", sb.ID, cp.ID)
			if cp.Memory {
				dir = filepath.Join(dir, "mem")
			}
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("checkpoint %s of %s is listed without its data: %v", cp.ID, sb.Name, err)
			}
			snaps = append(snaps, sb.ID+"."+cp.ID)
			cpDirs[sb.ID] = append(cpDirs[sb.ID], cp.ID)
		}
	}
	tplDir := filepath.Join(data, "checkpoint-templates")
	for _, name := range dirNamesOf(tplDir) {
		b, err := os.ReadFile(filepath.Join(tplDir, name, "manifest.json"))
		var man struct{ Snapshot string }
		if err == nil {
			err = json.Unmarshal(b, &man)
		}
		if err != nil {
			t.Errorf("template dir %s: %v", name, err)
			continue
		}
		snaps = append(snaps, man.Snapshot)
	}
	same := func(what string, got, want []string) {
		t.Helper()
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	same("sandbox dirs", dirNamesOf(filepath.Join(data, "sandboxes")), keys(ids))
	same("disk volumes", dirNamesOf(filepath.Join(data, "disk", "mnt", "volumes")), keys(ids))
	same("disk snapshots", dirNamesOf(filepath.Join(data, "disk", "mnt", "snapshots")), snaps)
	same("disk work in progress", dirNamesOf(filepath.Join(data, "disk", "mnt", "tmp")), nil)
	images, err := c.d.C.ListImages(c.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var imageTpls, wantTpls []string
	for _, im := range images {
		if hex := strings.TrimPrefix(im.Digest, "sha256:"); len(hex) >= 16 {
			wantTpls = append(wantTpls, "image-"+hex[:16])
		}
	}
	for _, name := range dirNamesOf(filepath.Join(data, "disk", "mnt", "templates")) {
		if strings.HasPrefix(name, "image-") {
			imageTpls = append(imageTpls, name)
		}
	}
	same("image templates in the disk pool", imageTpls, wantTpls)
	var withCPs []string
	for id, cps := range cpDirs {
		withCPs = append(withCPs, id)
		same("checkpoint data of "+id, dirNamesOf(filepath.Join(data, "checkpoints", id)), cps)
	}
	var cpParents []string
	for _, id := range dirNamesOf(filepath.Join(data, "checkpoints")) {
		if len(dirNamesOf(filepath.Join(data, "checkpoints", id))) > 0 || !ids[id] {
			cpParents = append(cpParents, id)
		}
	}
	same("checkpoint dirs", cpParents, withCPs)
	same("runsc containers", runscList(t, filepath.Join(data, "runsc")), keys(running))
	if c.mounts != nil {
		same("mounts under the data dir", mountsUnder(data), slices.Clone(c.mounts))
		if n := loopsOf(data); n != c.loops {
			t.Errorf("%d loop devices on the pool's image, want %d", n, c.loops)
		}
	}
	if n := len(c.nftChains(t)); n != len(ids) {
		t.Errorf("%d sandbox chains in firewall %s for %d sandboxes", n, c.table(), len(ids))
	}
	// What the host holds of sandboxes this daemon ever named, and no
	// record has now.
	all := c.logs.String() + c.d.log.String()
	for _, id := range uniqStrings(regexp.MustCompile(`\bsb-[a-z0-9]{12}\b`).FindAllString(all, -1)) {
		if ids[id] {
			continue
		}
		if _, err := os.Stat(filepath.Join("/run/netns", "loam-"+id)); err == nil {
			t.Errorf("network namespace loam-%s of a sandbox gone is left", id)
		}
		if _, err := os.Stat(filepath.Join("/sys/class/net", "lm"+strings.TrimPrefix(id, "sb-"))); err == nil {
			t.Errorf("veth of a sandbox gone (%s) is left", id)
		}
		if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "loam", id)); len(m) > 0 {
			t.Errorf("cgroups of a sandbox gone are left: %v", m)
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", "loam", id)); err == nil {
			t.Errorf("cgroup of a sandbox gone (%s) is left", id)
		}
	}
	for _, id := range keys(ids) {
		if !running[id] {
			continue
		}
		if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "loam", id)); len(m) == 0 {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", "loam", id)); err != nil {
				t.Logf("no cgroup found for running sandbox %s (cgroup layout?)", id)
			}
		}
	}
}

func mapOr(m map[string]bool) map[string]bool {
	if m == nil {
		return map[string]bool{}
	}
	return m
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func uniqStrings(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// dirNamesOf lists a directory's entries (none when it is missing).
func dirNamesOf(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// runscList lists the containers of a runsc root.
func runscList(t *testing.T, root string) []string {
	t.Helper()
	out, err := exec.Command(findRunsc(), "--root", root, "list", "-quiet").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	return strings.Fields(string(out))
}

// mountsUnder lists the mount points below dir.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mounts")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			out = append(out, f[1])
		}
	}
	return out
}

// loopsOf counts the loop devices on dir's disk pool image.
func loopsOf(dir string) int {
	out, _ := exec.Command("losetup", "-j", filepath.Join(dir, "disk", "disk.img")).Output()
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	return n
}
