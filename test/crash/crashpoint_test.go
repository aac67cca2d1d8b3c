package crash

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/image/imagetest"
	"loam.dev/loam/test/harness"
)

// TestCrashPoints kills the daemon (SIGKILL) at every named crash point
// (internal/crash) in turn, on a data dir per shard and one daemon binary built
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
	t.Parallel()
	start := time.Now()
	bin := filepath.Join(t.TempDir(), "loam-crashpoints")
	build := exec.Command("go", "build", "-tags", "crashpoints", "-o", bin, "loam.dev/loam/cmd/loam")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building loam with crash points: %v\n%s", err, out)
	}
	t.Logf("built loam with crash points in %v", time.Since(start).Round(time.Millisecond))
	checkReleaseBinary(t, bin)

	// The cases leave the sandbox as they found it, so they are dealt
	// out to shards, each a daemon of its own, run in parallel
	// (LOAM_CRASH_SHARDS; 1 runs them all on one daemon, in order).
	shards := harness.EnvInt(t, "LOAM_CRASH_SHARDS", 4)
	for shard := range shards {
		t.Run(fmt.Sprintf("shard-%d-of-%d", shard+1, shards), func(t *testing.T) {
			t.Parallel()
			crashPoints(t, bin, shard, shards)
		})
	}
}

// crashPoints runs the cases of TestCrashPoints whose number is shard
// modulo shards, on a daemon of its own; every case is named (for the
// check that each crash point has one) in every shard.
func crashPoints(t *testing.T, bin string, shard, shards int) {
	start := time.Now()
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
	cases := 0
	// run runs the case of a point, if it is this shard's; a point with
	// more than one case names the others POINT@WHAT.
	run := func(point string, f func(t *testing.T)) {
		base, _, _ := strings.Cut(point, "@")
		covered[base] = true
		cases++
		if (cases-1)%shards != shard {
			return
		}
		t.Run(point, func(t *testing.T) {
			began := time.Now()
			f(t)
			// The start-up that recovered says what it removed.
			for _, line := range recoveryLogs[point] {
				if !strings.Contains(c.d.Log.String(), line) {
					t.Errorf("the recovery after %s did not log %q", point, line)
				}
			}
			c.checkAll(t)
			t.Logf("%s: %v", point, time.Since(began).Round(time.Millisecond))
			if t.Failed() {
				t.Logf("log of the run that crashed:\n%s\nlog of the run that recovered:\n%s", c.crashLog, c.d.Log.String())
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
	// stored, is as before too: the sandbox is started again from the
	// image that checkpoint wrote.
	for _, p := range []string{"restore.numbered", "restore.auto-image", "restore.auto-gen", "restore.auto-kept",
		"restore.restoring", "rollback.stopped", "rollback.disk-dropped", "rollback.disk-back",
		"resume.restored", "resume.connected"} {
		run(p, func(t *testing.T) {
			before := c.listCPs(t, "main")
			c.crash(t, p, func(ctx context.Context) error {
				_, err := c.d.C.RestoreCheckpoint(ctx, "main", memCP)
				return err
			})
			c.beforeOrRestored(t, before, "")
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
			c.beforeOrRestored(t, before, api.StateSleeping)
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
	// before the image is durable, leaves it running as before: started
	// again from that image.
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
			default:
				t.Errorf("disk|memory %q, want d1|m1", got)
			}
		})
	}

	// A crash while the start-up recovers from a crash: the start after
	// that finishes both. Recovery's steps are the operations' own (a
	// delete's destroy, a restore's roll back) or its own (a sandbox
	// resumed from the image a cut sleep or restore wrote), and each must
	// hold when it runs a second time over what a first run left.
	run("destroy.disk@recovering-delete.marked", func(t *testing.T) {
		c.create(t, "doomed")
		c.checkpoint(t, "doomed", false)
		c.crashTwice(t, "delete.marked", "destroy.disk", func(ctx context.Context) error {
			return c.d.C.DeleteSandbox(ctx, "doomed")
		})
		if sb, err := c.d.C.GetSandbox(c.ctx, "doomed"); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("after a delete and its recovery cut short: %+v, %v; want not found", sb, err)
		}
	})
	for _, pq := range [][2]string{{"restore.auto-kept", "rollback.disk-dropped"}, {"restore.auto-kept", "resume.restored"},
		{"restore.auto-gen", "recover.resumed"}} {
		run(pq[1]+"@recovering-"+pq[0], func(t *testing.T) {
			before := c.listCPs(t, "main")
			c.crashTwice(t, pq[0], pq[1], func(ctx context.Context) error {
				_, err := c.d.C.RestoreCheckpoint(ctx, "main", memCP)
				return err
			})
			c.beforeOrRestored(t, before, "")
		})
	}
	run("recover.resumed@recovering-sleep.image", func(t *testing.T) {
		c.crashTwice(t, "sleep.image", "recover.resumed", func(ctx context.Context) error {
			_, err := c.d.C.Sleep(ctx, "main")
			return err
		})
		st := c.state(t, "main")
		t.Logf("after the crashes: %s", st)
		if st != api.StateRunning && st != api.StateSleeping {
			t.Fatalf("state %s, want running or sleeping", st)
		}
		if got := c.facts(t, "main"); got != "d1|m1" {
			t.Errorf("disk|memory %q, want d1|m1", got)
		}
	})

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
		// Made by the cases above, unless they ran in another shard.
		if !c.hasTemplate(t, "crashtpl") {
			if _, err := c.d.C.CreateTemplate(c.ctx, "crashtpl", "main", memCP); err != nil {
				t.Fatal(err)
			}
		}
		c.crash(t, "template-delete.renamed", func(ctx context.Context) error {
			return c.d.C.DeleteTemplate(ctx, "crashtpl")
		})
		if c.hasTemplate(t, "crashtpl") {
			t.Errorf("template crashtpl is listed after its delete was cut short after its rename")
		}
	})

	// A template imported from an archive (one exported here): none, or
	// one whose sandboxes work. The import goes through the same publish
	// as a template made from a checkpoint, whose points it crashes at too.
	var archive bytes.Buffer
	if _, err := c.d.C.CreateTemplate(c.ctx, "exported", "main", memCP); err != nil {
		t.Fatal(err)
	}
	if _, err := c.d.C.ExportTemplate(c.ctx, "exported", &archive); err != nil {
		t.Fatal(err)
	}
	if err := c.d.C.DeleteTemplate(c.ctx, "exported"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"template-import.unpacked", "template.filled@import", "template.synced@import"} {
		run(p, func(t *testing.T) {
			point, _, _ := strings.Cut(p, "@")
			c.crash(t, point, func(ctx context.Context) error {
				_, err := c.d.C.ImportTemplate(ctx, "imported", bytes.NewReader(archive.Bytes()))
				return err
			})
			if c.hasTemplate(t, "imported") {
				t.Logf("the template was imported")
				c.create(t, "from-import", "imported")
				c.expectFacts(t, "from-import", "d0|m0")
				c.delete(t, "from-import")
				if err := c.d.C.DeleteTemplate(c.ctx, "imported"); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

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
		trees, _ := filepath.Glob(filepath.Join(harness.TemplateCache(), "images", "image-"+hex[:16]+"-*"))
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
	t.Logf("%d crash points, %d cases of %d in this shard, in %v", len(crash.Points), (cases+shards-1-shard)/shards, cases,
		time.Since(start).Round(time.Millisecond))
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
	"create.stored": {"finishing interrupted operation"},
	"boot.disk":     {"finishing interrupted operation"},
	"boot.started":  {"finishing interrupted operation"},
	// The runsc checkpoint that holds the sandbox paused resumes it when
	// the daemon dies, mostly before the restarted daemon's recovery
	// would (which resumes it when it comes first).
	"checkpoint.image":         {"removing unfinished checkpoint data"},
	"checkpoint.snapshot":      {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint.synced":        {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint.renamed":       {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint.disk-snapshot": {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint.asleep":        {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"checkpoint-delete.record": {"removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"restore.auto-image":       {"resumed from the image it wrote", "removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"restore.auto-gen":         {"resumed from the image it wrote", "removing unfinished checkpoint data", "removing unfinished checkpoint snapshot"},
	"sleep.image":              {"resumed from the image it wrote"},
	"restore.auto-kept":        {"finishing it"},
	"rollback.disk-dropped":    {"finishing interrupted restore", "removing orphaned disk"},
	"fork.disk":                {"finishing interrupted operation"},
	"sleep.durable":            {"finishing interrupted sleep"},
	"wake.restored":            {"finishing interrupted wake"},
	"template.volume":          {"removing unfinished template data", "removing orphaned disk"},
	"template.filled":          {"removing unfinished template data", "removing unfinished template snapshot"},
	"template-delete.renamed":  {"removing unfinished template data", "removing unfinished template snapshot"},
	"template-import.unpacked": {"removing unfinished template data"},
	"template.filled@import":   {"removing unfinished template data", "removing unfinished template snapshot"},
	"destroy.container":        {"finishing interrupted operation"},
	"image-delete.record":      {"removing the template of an image that is gone"},
}

// checkReleaseBinary checks that the release build (harness.LoamBin, built without
// the tag) carries neither the variable that arms crash points nor their
// names, while the build with the tag carries both.
func checkReleaseBinary(t *testing.T, withPoints string) {
	rel, err := os.ReadFile(harness.LoamBin)
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
