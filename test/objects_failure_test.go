package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/checkpoints"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/objects/s3test"
	"loam.dev/loam/internal/store/postgres/pgtest"
	"loam.dev/loam/test/harness"
)

// The object store's failure cases (issue 24), end to end: a real S3
// server (versitygw) stopped, a daemon killed mid-upload, a stored object
// corrupted, a node of another runsc build.

// TestObjectsOutage: with the object store down, a checkpoint is taken
// all the same, on the node (storage local, the upload's error shown),
// and a restore and a fork from it work there; a wait for it to be
// stored does not answer. Once the store is back, every checkpoint taken
// meanwhile (the restore's automatic one too) is stored, its manifest in
// the bucket: nothing is lost.
func TestObjectsOutage(t *testing.T) {
	t.Parallel()
	srv := s3test.NewServer(t, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	d, st, _ := objectsDaemonOn(t, srv)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "out"})
	if err != nil {
		t.Fatal(err)
	}
	d.Run("out", "sh", "-c", "echo before > /home/loam/mark; (sleep 100000 &)")
	pid := strings.TrimSpace(d.Run("out", "pidof", "sleep"))
	if pid == "" {
		t.Fatal("no sleep in out")
	}

	srv.Stop()
	down := time.Now()
	v1, err := d.C.CreateCheckpoint(ctx, "out", api.CreateCheckpoint{})
	if err != nil {
		t.Fatalf("a memory checkpoint with the object store down: %v", err)
	}
	t.Logf("a memory checkpoint with the object store down: taken in %v", time.Since(down).Round(time.Millisecond))
	if v1.Storage == nil || v1.Storage.State != api.StorageLocal {
		t.Errorf("a checkpoint taken with the object store down: storage %+v, want local", v1.Storage)
	}
	harness.Eventually(t, 2*time.Minute, "v1's upload fails and says why", func() error {
		cp, err := d.C.GetCheckpoint(ctx, "out", v1.ID)
		if err != nil {
			return err
		}
		if s := cp.Storage; s == nil || s.State != api.StorageLocal || s.Error == "" {
			return fmt.Errorf("storage %+v, want local with the upload's error", s)
		}
		return nil
	})

	// On its node, the checkpoint is all there: a restore, and a fork.
	d.Run("out", "sh", "-c", "echo after > /home/loam/mark")
	if _, err := d.C.RestoreCheckpoint(ctx, "out", v1.ID); err != nil {
		t.Fatalf("a restore with the object store down: %v", err)
	}
	if got := d.Run("out", "sh", "-c", "cat /home/loam/mark; pidof sleep"); got != "before\n"+pid+"\n" {
		t.Errorf("out restored with the object store down: %q, want its mark and sleep (pid %s) of v1", got, pid)
	}
	if _, err := d.C.Fork(ctx, "out", v1.ID, "out-fork"); err != nil {
		t.Fatalf("a fork with the object store down: %v", err)
	}
	if got := d.Run("out-fork", "sh", "-c", "cat /home/loam/mark; pidof sleep"); got != "before\n"+pid+"\n" {
		t.Errorf("the fork made with the object store down: %q, want v1's mark and sleep (pid %s)", got, pid)
	}
	no := false
	if _, err := d.C.CreateCheckpoint(ctx, "out", api.CreateCheckpoint{Memory: &no}); err != nil {
		t.Fatalf("a disk-only checkpoint with the object store down: %v", err)
	}
	if cp, err := getStored(d, "out", v1.ID, 3*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("GET ?wait=stored with the object store down: %+v, %v; want no answer within 3s", cp, err)
	}
	taken, err := d.C.ListCheckpoints(ctx, "out")
	if err != nil {
		t.Fatal(err)
	}
	if len(taken) != 3 { // v1, the restore's automatic one, v2
		t.Errorf("checkpoints taken with the object store down: %d, want 3", len(taken))
	}
	for _, cp := range taken {
		if cp.Storage == nil || cp.Storage.State != api.StorageLocal {
			t.Errorf("checkpoint %s with the object store down: storage %+v, want local", cp.ID, cp.Storage)
		}
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("the object store was down %v", back.Sub(down).Round(time.Millisecond))
	for _, cp := range taken {
		got, err := getStored(d, "out", cp.ID, 5*time.Minute)
		if err != nil || got.Storage == nil || got.Storage.State != api.StorageStored {
			t.Errorf("checkpoint %s once the object store is back: %+v, %v; want stored", cp.ID, got, err)
			continue
		}
		if _, err := st.GetManifest(ctx, checkpoints.ManifestName(sb.ID, cp.ID)); err != nil {
			t.Errorf("checkpoint %s's manifest: %v", cp.ID, err)
		}
	}
	t.Logf("the %d checkpoints taken during the outage: stored %v after the object store came back (%d failed tries logged)",
		len(taken), time.Since(back).Round(time.Millisecond), strings.Count(d.Log.String(), "uploading a checkpoint"))
}

// TestObjectsKilledMidUpload: a daemon killed (SIGKILL) while a
// checkpoint of 200 MB of random data uploads leaves no manifest of it in
// the bucket, nothing that passes for complete; the next start says it
// resumes, uploads it again, removes the cut-short upload's archive, and
// the checkpoint is stored, its archive whole (its digest checked on the
// fetch, its disk holding the data).
func TestObjectsKilledMidUpload(t *testing.T) {
	t.Parallel()
	srv := s3test.Shared(t)
	d, st, url := objectsDaemonOn(t, srv)
	ctx := harness.Ctx(t)
	sb, err := d.C.CreateSandbox(ctx, api.CreateSandbox{Name: "big"})
	if err != nil {
		t.Fatal(err)
	}
	sum := strings.Fields(d.Run("big", "sh", "-c", "dd if=/dev/urandom of=/home/loam/big bs=1M count=200 2>/dev/null && sync && sha256sum /home/loam/big"))[0]

	// Kill while the archive's blob is under way: some of it sent, less
	// than half (so its manifest is not written yet). A host so fast
	// that a look misses it takes another checkpoint.
	var cut *api.Checkpoint
	for try := 0; try < 3 && cut == nil; try++ {
		cp, err := d.C.CreateCheckpoint(ctx, "big", api.CreateCheckpoint{})
		if err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 5*time.Minute, "checkpoint "+cp.ID+"'s upload under way", func() error {
			got, err := d.C.GetCheckpoint(ctx, "big", cp.ID)
			if err != nil {
				return err
			}
			s := got.Storage
			switch {
			case s == nil:
				return fmt.Errorf("no storage")
			case s.State == api.StorageStored:
				t.Logf("checkpoint %s was stored before a look saw its upload under way", cp.ID)
				return nil
			case s.UploadedBytes > 0 && s.UploadedBytes < s.TotalBytes/2:
				cut = got
				return nil
			}
			return fmt.Errorf("storage %+v", s)
		})
	}
	if cut == nil {
		t.Fatal("no look saw an upload under way in 3 checkpoints")
	}
	d.KillSettled()
	t.Logf("killed with %d of %d bytes of %s uploaded", cut.Storage.UploadedBytes, cut.Storage.TotalBytes, cut.ID)

	if _, err := st.GetManifest(ctx, checkpoints.ManifestName(sb.ID, cut.ID)); !errors.Is(err, objects.ErrNotFound) {
		t.Errorf("%s's manifest after a kill mid-upload: %v, want none", cut.ID, err)
	}
	keys := bucketKeys(t, srv, url)
	if i := slices.IndexFunc(keys, func(k string) bool { return strings.Contains(k, cut.ID) }); i >= 0 {
		t.Errorf("the bucket after a kill mid-upload holds %s", keys[i])
	}
	bucket, _ := bucketOf(t, url)
	pending, err := srv.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the bucket after the kill: keys %v, %d multipart uploads not completed", keys, len(pending.Uploads))
	if left, _ := filepath.Glob(filepath.Join(d.DataDir, "uploads", "*.tar.zst")); len(left) == 0 {
		t.Error("no archive of the cut-short upload in uploads/: was the kill mid-upload?")
	}

	d.Start("--objects", url)
	restarted := time.Now()
	got, err := getStored(d, "big", cut.ID, 5*time.Minute)
	if err != nil || got.Storage == nil || got.Storage.State != api.StorageStored {
		t.Fatalf("%s after the restart: %+v, %v; want stored", cut.ID, got, err)
	}
	t.Logf("%s stored %v after the restart", cut.ID, time.Since(restarted).Round(time.Millisecond))
	if !strings.Contains(d.Log.String(), "uploading checkpoints not stored yet") {
		t.Errorf("the restarted daemon does not say it resumes the uploads:\n%s", d.Log.String())
	}
	if left, _ := filepath.Glob(filepath.Join(d.DataDir, "uploads", "*.tar.zst")); len(left) != 0 {
		t.Errorf("archives left in uploads/ once all is stored: %v", left)
	}
	m, err := st.GetManifest(ctx, checkpoints.ManifestName(sb.ID, cut.ID))
	if err != nil {
		t.Fatal(err)
	}
	unpacked, _ := unpackStored(t, st, m)
	if got := fileSum(t, filepath.Join(unpacked, checkpoint.DiskEntry, "home", "loam", "big")); got != sum {
		t.Errorf("the stored disk's /home/loam/big: sha256 %s, want %s", got, sum)
	}
	if got := strings.Fields(d.Run("big", "sha256sum", "/home/loam/big"))[0]; got != sum {
		t.Errorf("big after the restart: sha256 %s, want %s", got, sum)
	}
}

// TestObjectsCorrupt: a stored checkpoint whose archive's bytes are
// changed in the bucket (same size, other bytes) does not fork on a node
// that must fetch it: refused, unavailable, saying it failed its
// checksum, nothing left of it there (no sandbox, no snapshot, no data,
// nothing cached), the source sandbox untouched; with the right bytes
// back, the fork is made (the bad download was not kept).
func TestObjectsCorrupt(t *testing.T) {
	t.Parallel()
	srv := s3test.Shared(t)
	bucket := srv.NewBucket(t, "corrupt/")
	db := pgtest.NewDatabase(t)
	a := startNode(t, db, "a", "", "--objects", bucket)
	startNode(t, db, "b", a.Token, "--objects", bucket)
	ctx := harness.Ctx(t)
	src, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", Node: "b"})
	if err != nil {
		t.Fatal(err)
	}
	a.Run("src", "sh", "-c", "echo from-b > /home/loam/mark; (sleep 100000 &)")
	pid := strings.TrimSpace(a.Run("src", "pidof", "sleep"))
	cp, err := a.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Wait: api.WaitStored})
	if err != nil {
		t.Fatal(err)
	}
	blob := storedManifest(t, bucket, src.ID, cp.ID).Files["checkpoint.tar.zst"]
	key := "blobs/sha256/" + strings.TrimPrefix(blob.Digest, "sha256:")
	good := getObject(t, srv, bucket, key)
	if int64(len(good)) != blob.Size {
		t.Fatalf("the archive's object: %d bytes, want %d", len(good), blob.Size)
	}
	bad := slices.Clone(good)
	bad[len(bad)/2] ^= 0xff
	putObject(t, srv, bucket, key, bad)

	_, err = a.C.ForkWith(ctx, "src", cp.ID, api.CreateSandbox{Name: "bad", Node: "a"})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || !strings.Contains(ae.Message, "failed its checksum") {
		t.Fatalf("a fork on a of a checkpoint whose stored archive is corrupt: %v, want unavailable saying it failed its checksum", err)
	}
	t.Logf("the refusal: %s", ae.Message)
	if _, err := a.C.GetSandbox(ctx, "bad"); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("the refused fork's sandbox: %v, want not_found", err)
	}
	if snaps, _ := filepath.Glob(filepath.Join(a.DataDir, "disk", "mnt", "snapshots", checkpoint.Snapshot(src.ID, "*"))); len(snaps) != 0 {
		t.Errorf("snapshots on a of the corrupt checkpoint: %v", snaps)
	}
	if _, err := os.Stat(checkpoint.Dir(a.DataDir, src.ID, cp.ID)); !os.IsNotExist(err) {
		t.Errorf("the corrupt checkpoint's data on a: %v, want none", err)
	}
	if cached, _ := filepath.Glob(filepath.Join(a.DataDir, "objects-cache", "*")); len(cached) != 0 {
		t.Errorf("a's cache after the corrupt fetch: %v, want empty", cached)
	}
	if staged, _ := os.ReadDir(filepath.Join(a.DataDir, "fetch")); len(staged) != 0 {
		t.Errorf("a's fetch staging after the corrupt fetch: %v, want empty", staged)
	}
	if sb, err := a.C.GetSandbox(ctx, "src"); err != nil || sb.State != api.StateRunning || sb.Node != "b" {
		t.Errorf("src after the refused fork: %+v, %v; want running on b", sb, err)
	}
	if got := a.Run("src", "sh", "-c", "cat /home/loam/mark; pidof sleep"); got != "from-b\n"+pid+"\n" {
		t.Errorf("src after the refused fork: %q, want its mark and sleep (pid %s)", got, pid)
	}

	putObject(t, srv, bucket, key, good)
	fork, err := a.C.ForkWith(ctx, "src", cp.ID, api.CreateSandbox{Name: "good", Node: "a"})
	if err != nil {
		t.Fatalf("a fork on a with the right bytes back: %v", err)
	}
	if fork.Node != "a" {
		t.Errorf("the fork: node %q, want a", fork.Node)
	}
	if got := a.Run("good", "sh", "-c", "cat /home/loam/mark; pidof sleep"); got != "from-b\n"+pid+"\n" {
		t.Errorf("the fork made on a: %q, want src's mark and sleep (pid %s)", got, pid)
	}
	if n := strings.Count(a.Log.String(), "fetched a checkpoint"); n != 1 {
		t.Errorf("a fetched the checkpoint %d times, want once", n)
	}
}

// TestObjectsOtherRunsc: a memory checkpoint stored by node a does not
// fork on node b, which runs another runsc build (a wrapper that answers
// --version with another line): refused, conflict, naming both builds.
// A disk-only checkpoint of the same sandbox forks there.
func TestObjectsOtherRunsc(t *testing.T) {
	t.Parallel()
	const other = "release-20990101.0"
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$#\" -eq 1 ] && [ \"$1\" = --version ]; then\n\techo 'runsc version %s'\n\techo 'spec: 1.2.1'\n\texit 0\nfi\nexec %s \"$@\"\n",
		other, harness.Runsc())
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	bucket := s3test.NewBucket(t, "runsc/")
	db := pgtest.NewDatabase(t)
	a := startNode(t, db, "a", "", "--objects", bucket)
	startNode(t, db, "b", a.Token, "--objects", bucket, "--runsc", wrapper)
	ctx := harness.Ctx(t)
	src, err := a.C.CreateSandbox(ctx, api.CreateSandbox{Name: "src", Node: "a"})
	if err != nil {
		t.Fatal(err)
	}
	a.Run("src", "sh", "-c", "echo from-a > /home/loam/mark")
	mem, err := a.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Wait: api.WaitStored})
	if err != nil {
		t.Fatal(err)
	}
	no := false
	disk, err := a.C.CreateCheckpoint(ctx, "src", api.CreateCheckpoint{Memory: &no, Wait: api.WaitStored})
	if err != nil {
		t.Fatal(err)
	}
	var meta checkpoints.StoredMeta
	if err := json.Unmarshal(storedManifest(t, bucket, src.ID, mem.ID).Meta, &meta); err != nil || meta.Runsc == "" || meta.Runsc == other {
		t.Fatalf("the memory checkpoint's runsc build: %q (%v), want a's own", meta.Runsc, err)
	}

	_, err = a.C.ForkWith(ctx, "src", mem.ID, api.CreateSandbox{Name: "mem-on-b", Node: "b"})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeConflict || !strings.Contains(ae.Message, "runsc "+meta.Runsc) || !strings.Contains(ae.Message, "this node runs "+other) {
		t.Fatalf("a fork on b of a memory checkpoint of another runsc build: %v, want conflict naming %s and %s", err, meta.Runsc, other)
	}
	t.Logf("the refusal: %s", ae.Message)
	if _, err := a.C.GetSandbox(ctx, "mem-on-b"); harness.APICode(err) != api.CodeNotFound {
		t.Errorf("the refused fork's sandbox: %v, want not_found", err)
	}
	fork, err := a.C.ForkWith(ctx, "src", disk.ID, api.CreateSandbox{Name: "disk-on-b", Node: "b"})
	if err != nil {
		t.Fatalf("a fork on b of a disk-only checkpoint: %v", err)
	}
	if fork.Node != "b" {
		t.Errorf("the disk-only fork: node %q, want b", fork.Node)
	}
	if got := a.Run("disk-on-b", "cat", "/home/loam/mark"); got != "from-a\n" {
		t.Errorf("the disk-only fork on b: mark %q, want a's", got)
	}
}

// getStored is GET …/checkpoints/{cp}?wait=stored, given up after within
// (context.DeadlineExceeded).
func getStored(d *harness.Daemon, sb, cp string, within time.Duration) (*api.Checkpoint, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", d.URL+"/v1/sandboxes/"+sb+"/checkpoints/"+cp+"?wait=stored", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+d.Token)
	res, err := d.HTTPClient().Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%d %s", res.StatusCode, body)
	}
	var v api.Checkpoint
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// storedManifest is the manifest of checkpoint cpID of sandboxID in the
// object store of the --objects URL given.
func storedManifest(t testing.TB, rawURL, sandboxID, cpID string) *objects.Manifest {
	t.Helper()
	st, err := objects.Open(t.Context(), rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := st.GetManifest(t.Context(), checkpoints.ManifestName(sandboxID, cpID))
	if err != nil {
		t.Fatalf("checkpoint %s of %s in the object store: %v", cpID, sandboxID, err)
	}
	return m
}

// bucketOf is the bucket and key prefix of an --objects URL.
func bucketOf(t *testing.T, rawURL string) (bucket, prefix string) {
	t.Helper()
	u, err := neturl.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host, u.Query().Get("prefix")
}

// bucketKeys lists the keys under the prefix of the --objects URL on srv,
// without it.
func bucketKeys(t *testing.T, srv *s3test.Server, rawURL string) []string {
	t.Helper()
	bucket, prefix := bucketOf(t, rawURL)
	var keys []string
	p := s3.NewListObjectsV2Paginator(srv.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(t.Context())
		if err != nil {
			t.Fatalf("listing %s: %v", bucket, err)
		}
		for _, o := range page.Contents {
			keys = append(keys, strings.TrimPrefix(aws.ToString(o.Key), prefix))
		}
	}
	return keys
}

// getObject reads key (under the URL's prefix) of the --objects URL on srv.
func getObject(t *testing.T, srv *s3test.Server, rawURL, key string) []byte {
	t.Helper()
	bucket, prefix := bucketOf(t, rawURL)
	out, err := srv.Client().GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(prefix + key)})
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	return b
}

// putObject writes body as key (under the URL's prefix) of the --objects
// URL on srv, behind loam's back.
func putObject(t *testing.T, srv *s3test.Server, rawURL, key string, body []byte) {
	t.Helper()
	bucket, prefix := bucketOf(t, rawURL)
	if _, err := srv.Client().PutObject(t.Context(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(prefix + key), Body: bytes.NewReader(body)}); err != nil {
		t.Fatalf("writing %s: %v", key, err)
	}
}

// fileSum is the hex SHA-256 of the file at path.
func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
