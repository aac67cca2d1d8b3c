package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoints"
	"loam.dev/loam/internal/objects/s3test"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// diffChanges changes a busybox sandbox's disk in every way a diff
// carries: a template file changed, files and a directory added, a
// template file and a link removed, a file's mode changed.
const diffChanges = `set -e
echo '# changed' >> /etc/group
rm /bin/tac /bin/rev
mkdir -p /opt/new/deep && echo added > /opt/new/deep/file
head -c 1048576 /dev/urandom > /home/loam/big
echo note > /home/loam/note
chmod 600 /etc/passwd`

// diffState is what a sandbox shows of diffChanges.
const diffState = `cat /etc/group | tail -n 1; test -e /bin/tac && echo tac || echo no-tac; cat /opt/new/deep/file /home/loam/note;
sha256sum /home/loam/big | cut -d' ' -f1; stat -c %a /etc/passwd; /bin/ls /bin | wc -l`

// TestClusterForkDiff: a checkpoint of a sandbox that changed a little of
// its template is stored as a diff against it (small beside the template,
// which is stored beside it once), and a fork of it on another node,
// which has never made that template (it makes it from the stored one),
// has the disk of the source: the changed, added and removed files, the
// mode, all as they were, and its process running. A second fork there
// fetches the base no more.
func TestClusterForkDiff(t *testing.T) {
	t.Parallel()
	bucket := s3test.NewBucket(t, "diff/")
	db := pgtest.NewDatabase(t)
	a := startNode(t, db, "a", "", "--objects", bucket)
	b := startNode(t, db, "b", a.Token, "--objects", bucket)
	ctx := harness.Ctx(t)
	sb, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", Node: "a", Template: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runAs(a.Daemon, "root", "src", "sh", "-c", diffChanges); code != 0 {
		t.Fatalf("changing src: %s %s", out, errOut)
	}
	a.Run("src", "sh", "-c", "(sleep 100000 &)")
	pid := strings.TrimSpace(a.Run("src", "pidof", "sleep"))
	want := a.Run("src", "sh", "-c", diffState)
	cp, err := a.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Wait: api.WaitStored})
	if err != nil {
		t.Fatal(err)
	}

	m := storedManifest(t, bucket, sb.ID, cp.ID)
	var meta checkpoints.StoredMeta
	if err := json.Unmarshal(m.Meta, &meta); err != nil || meta.Base == nil || meta.Base.Name != "busybox" {
		t.Fatalf("the stored checkpoint's base: %s (%v), want busybox", m.Meta, err)
	}
	diff, base := m.Files["checkpoint.tar.zst"], m.Files["base.tar.zst"]
	t.Logf("stored: the diff (with the memory image) %d bytes, the template %d bytes", diff.Size, base.Size)

	fork, err := a.C.ForkWith(ctx, "src", cp.ID, api.CreateSandbox{Name: "far", Node: "b"})
	if err != nil {
		t.Fatalf("a fork on b: %v", err)
	}
	if fork.Node != "b" {
		t.Fatalf("the fork is on %s, want b", fork.Node)
	}
	if got := b.Run("far", "sh", "-c", diffState); got != want {
		t.Errorf("the fork's disk:\n%s\nwant the source's:\n%s", got, want)
	}
	if got := strings.TrimSpace(b.Run("far", "pidof", "sleep")); got != pid {
		t.Errorf("the fork's sleep: %q, want pid %s", got, pid)
	}
	if strings.Contains(b.Log.String(), "made a checkpoint's base template") {
		t.Errorf("b made the base from the store, though its busybox is the same tree:\n%s", b.Log.String())
	}

	// A node whose busybox is another tree (as its digest says: b's
	// record of it, made by the fork, changed) makes the base from the
	// store, once.
	record := filepath.Join(b.DataDir, "template-digests", "busybox.json")
	body, err := os.ReadFile(record)
	if err != nil {
		t.Fatalf("b's digest of its busybox: %v", err)
	}
	var rec map[string]any
	if err := json.Unmarshal(body, &rec); err != nil || rec["digest"] != meta.Base.Digest {
		t.Fatalf("b's digest of its busybox: %s (%v), want a's %s", body, err, meta.Base.Digest)
	}
	rec["digest"] = "sha256:" + strings.Repeat("0", 64)
	body, _ = json.Marshal(rec)
	if err := os.WriteFile(record, body, 0o600); err != nil {
		t.Fatal(err)
	}
	no := false
	for i, note := range []string{"second", "third"} {
		if _, errOut, code := runAs(a.Daemon, "root", "src", "sh", "-c", "echo "+note+" > /home/loam/note"); code != 0 {
			t.Fatal(errOut)
		}
		cp, err := a.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Memory: &no, Wait: api.WaitStored})
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("far%d", i+2)
		if _, err := a.C.ForkWith(ctx, "src", cp.ID, api.CreateSandbox{Name: name, Node: "b"}); err != nil {
			t.Fatalf("fork %s on b: %v", name, err)
		}
		if got, want := b.Run(name, "sh", "-c", diffState), strings.Replace(want, "note\n", note+"\n", 1); got != want {
			t.Errorf("fork %s's disk:\n%s\nwant:\n%s", name, got, want)
		}
	}
	if n := strings.Count(b.Log.String(), "made a checkpoint's base template from the object store"); n != 1 {
		t.Errorf("b made the base from the store %d times for two forks, want once", n)
	}
}
