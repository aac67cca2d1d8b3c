package checkpoints

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/store"
)

// Uploads keeps checkpoints in the object store as they are taken (the
// Uploader has it; nil on a daemon without one).
type Uploads interface {
	// Queue uploads checkpoint cp of sandbox sb in the background.
	Queue(sb *store.Sandbox, cp *store.Checkpoint)
	// Status says where checkpoint cpID of sandbox sandboxID is.
	Status(sandboxID, cpID string) *api.CheckpointStorage
	// Wait returns once that checkpoint is stored (queued first if it
	// is not), or ctx ends.
	Wait(ctx context.Context, sandboxID, cpID string) error
	// Stored asks the object store itself whether checkpoint ref of
	// sandboxID is there, complete (store.ErrNotFound: no such
	// checkpoint).
	Stored(ctx context.Context, sandboxID, ref string) (bool, error)
}

// storeCallTimeout bounds a call to the object store that an API call
// waits for beside its own work (a delete's Forget, a placement's Stored).
const storeCallTimeout = 10 * time.Second

// Names in the object store and beside a checkpoint's data.
const (
	// archiveFile is the file of a checkpoint's manifest that holds its
	// memory image and disk as one archive: whole (checkpoint.WriteArchive)
	// or, beside its base template (baseFile), its disk as a diff against
	// it (checkpoint.WriteDiff).
	archiveFile = "checkpoint.tar.zst"
	// storedFile, in a checkpoint's directory, says it is stored: the
	// manifest's name and its archive's blob, written once the manifest
	// is.
	storedFile = "stored.json"
)

// ManifestName is the object store's name of checkpoint cpID of sandbox
// sandboxID.
func ManifestName(sandboxID, cpID string) string { return "checkpoints/" + sandboxID + "/" + cpID }

// StoredMeta is a stored checkpoint's manifest's own description: what
// another node needs to know before it restores it.
type StoredMeta struct {
	Sandbox    string        `json:"sandbox"`
	Checkpoint string        `json:"checkpoint"`
	Memory     bool          `json:"memory"`
	Template   string        `json:"template,omitempty"`
	Image      string        `json:"image,omitempty"`
	Resources  api.Resources `json:"resources"`
	AgentGen   int           `json:"agent_gen"`
	// Node took it; Runsc is its runsc build and CPUFeatures the CPU
	// features its sandboxes saw: a memory image restores only where
	// both match.
	Node        string   `json:"node,omitempty"`
	Runsc       string   `json:"runsc,omitempty"`
	CPUFeatures []string `json:"cpu_features,omitempty"`
	// Base, when the archive's disk is a diff, is the template it is a
	// diff against (the manifest's baseFile holds it whole).
	Base *checkpoint.Base `json:"base,omitempty"`
}

// UploaderConfig is what an Uploader needs.
type UploaderConfig struct {
	// DataDir is the daemon's data dir (checkpoints' data, and a
	// directory of archives being uploaded, uploads/).
	DataDir string
	// Objects is the object store; Disks the pool whose snapshots hold
	// checkpoints' disks; Records the checkpoints' records.
	Objects *objects.Store
	Disks   Snapshots
	Records CheckpointRecords
	// Node, Runsc and CPUFeatures go into each manifest (StoredMeta).
	Node        string
	Runsc       string
	CPUFeatures func() []string
	// HostFeatures are this host's CPU features (gVisor's names): a
	// memory checkpoint that saw others is not fetched here.
	HostFeatures []string
	// Cache keeps what this node fetched, capped; nil fetches each time.
	Cache *objects.Cache
	// Sleeps, Volumes and Sandboxes, when all set, have the sleep images
	// stored too (see sleeps.go): the images, the disks they go with,
	// and the sandboxes' records.
	Sleeps    SleepImages
	Volumes   Volumes
	Sandboxes SandboxRecords
	// Retry is the first wait before an upload that failed is tried
	// again (doubling, up to ten minutes); 0 is five seconds.
	Retry time.Duration
}

// Snapshots is what the uploads need of the disk pool (disk.Pool has
// it): where a checkpoint's disk snapshot is, to archive it, and making
// one from a fetched checkpoint's disk; and templates, to write a disk
// as a diff against its template, and to apply one to a copy of it (a
// volume, snapshotted once the diff is applied).
type Snapshots interface {
	SnapshotPath(snap string) string
	Snapshots(ctx context.Context) ([]string, error)
	ImportSnapshot(ctx context.Context, snap, src string) error
	DeleteSnapshot(ctx context.Context, snap string) error

	HasTemplate(ctx context.Context, name string) (bool, error)
	TemplatePath(name string) string
	ImportTemplate(ctx context.Context, name, src string) error
	CreateVolume(ctx context.Context, id, template string) (string, error)
	Snapshot(ctx context.Context, id, snap string) error
	SyncSnapshot(ctx context.Context, snap string) error
	DeleteVolume(ctx context.Context, id string) error
}

// CheckpointRecords finds a checkpoint's record by its sandbox's id.
type CheckpointRecords interface {
	GetCheckpoint(ctx context.Context, sandboxID, ref string) (*store.Checkpoint, error)
}

// Uploader uploads a node's checkpoints to the object store, one at a
// time, in the order taken: a checkpoint is usable on its node at once and
// stored a moment later. Each is written as one archive blob (with its template's, see bases.go), then its
// manifest, then a mark beside its data (storedFile); a crash part-way
// leaves no manifest, and the next start uploads it again (Resume). It is
// safe for concurrent use.
type Uploader struct {
	cfg UploaderConfig
	log *slog.Logger

	fetching fetches
	digestMu sync.Mutex // one template digest at a time (digest)

	mu    sync.Mutex
	jobs  map[string]*upload // by ManifestName, until stored or forgotten
	queue []string
	wake  chan struct{}
}

// upload is one checkpoint's upload, from its queueing until it is stored.
type upload struct {
	sandbox, cp string
	// sleep marks the upload of a sleep image (cp ""), of the agent's
	// token generation sleepGen (see sleeps.go).
	sleep       bool
	sleepGen    int
	done, total int64
	err         string
	forgotten   bool
	stored      chan struct{} // closed once stored (or forgotten)
}

// NewUploader makes an uploader; Run runs it.
func NewUploader(cfg UploaderConfig, log *slog.Logger) *Uploader {
	if cfg.Retry <= 0 {
		cfg.Retry = 5 * time.Second
	}
	return &Uploader{cfg: cfg, log: log, jobs: map[string]*upload{}, wake: make(chan struct{}, 1)}
}

// storedPath is the mark of checkpoint cpID of sandboxID being stored.
func (u *Uploader) storedPath(sandboxID, cpID string) string {
	return filepath.Join(checkpoint.Dir(u.cfg.DataDir, sandboxID, cpID), storedFile)
}

// Queue uploads checkpoint cp of sb (see Uploads).
func (u *Uploader) Queue(sb *store.Sandbox, cp *store.Checkpoint) { u.queueIDs(sb.ID, cp.ID) }

func (u *Uploader) queueIDs(sandboxID, cpID string) *upload {
	name := ManifestName(sandboxID, cpID)
	u.mu.Lock()
	defer u.mu.Unlock()
	if j, ok := u.jobs[name]; ok {
		return j
	}
	j := &upload{sandbox: sandboxID, cp: cpID, stored: make(chan struct{})}
	u.jobs[name] = j
	u.queue = append(u.queue, name)
	select {
	case u.wake <- struct{}{}:
	default:
	}
	return j
}

// Status says where a checkpoint is (see Uploads).
func (u *Uploader) Status(sandboxID, cpID string) *api.CheckpointStorage {
	u.mu.Lock()
	j, ok := u.jobs[ManifestName(sandboxID, cpID)]
	var st api.CheckpointStorage
	if ok {
		st = api.CheckpointStorage{State: api.StorageLocal, UploadedBytes: j.done, TotalBytes: j.total, Error: j.err}
	}
	u.mu.Unlock()
	if ok {
		return &st
	}
	if _, err := os.Stat(u.storedPath(sandboxID, cpID)); err == nil {
		return &api.CheckpointStorage{State: api.StorageStored}
	}
	return &api.CheckpointStorage{State: api.StorageLocal}
}

// Wait returns once a checkpoint is stored (see Uploads).
func (u *Uploader) Wait(ctx context.Context, sandboxID, cpID string) error {
	if _, err := os.Stat(u.storedPath(sandboxID, cpID)); err == nil {
		return nil
	}
	j := u.queueIDs(sandboxID, cpID)
	select {
	case <-j.stored:
		u.mu.Lock()
		gone := j.forgotten
		u.mu.Unlock()
		if gone {
			return api.Errorf(api.CodeNotFound, "checkpoint %s of %s was deleted before it was stored", cpID, sandboxID)
		}
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Forget drops a checkpoint (or, with cpID "", every checkpoint of a
// sandbox) from the object store and from the queue (sandbox.Stored).
func (u *Uploader) Forget(ctx context.Context, sandboxID, cpID string) {
	prefix := ManifestName(sandboxID, cpID)
	if cpID == "" {
		prefix = ManifestName(sandboxID, "")
	}
	u.mu.Lock()
	for name, j := range u.jobs {
		if name == prefix || (cpID == "" && strings.HasPrefix(name, prefix)) {
			j.forgotten = true
			delete(u.jobs, name)
			close(j.stored)
		}
	}
	u.mu.Unlock()
	// A delete waits for this: an object store that does not answer
	// must not hold it up for long (what is left is the sweep's).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer cancel()
	names := []string{prefix}
	if cpID == "" {
		var err error
		if names, err = u.cfg.Objects.Manifests(ctx, prefix); err != nil {
			u.log.Warn("listing a sandbox's stored checkpoints to delete them", "sandbox", sandboxID, "err", err)
			return
		}
		// And its sleep images, if any.
		if sleeps, err := u.cfg.Objects.Manifests(ctx, "sleeps/"+sandboxID+"/"); err == nil {
			names = append(names, sleeps...)
		}
	}
	for _, name := range names {
		if err := u.cfg.Objects.DeleteManifest(ctx, name); err != nil {
			u.log.Warn("deleting a stored checkpoint", "manifest", name, "err", err)
		}
	}
}

// Resume queues every checkpoint on this node's disk that is not stored:
// those taken before a restart, or before the object store was given.
// It runs before Run: the archives in uploads/ are those of uploads a
// crash cut short, and it removes them (Run writes each anew).
func (u *Uploader) Resume(ctx context.Context) {
	left, _ := filepath.Glob(filepath.Join(u.cfg.DataDir, "uploads", "*.tar.zst"))
	for _, p := range left {
		os.Remove(p)
	}
	sandboxes, _ := os.ReadDir(filepath.Join(u.cfg.DataDir, "checkpoints"))
	n := 0
	for _, sb := range sandboxes {
		cps, _ := os.ReadDir(checkpoint.SandboxDir(u.cfg.DataDir, sb.Name()))
		for _, cp := range cps {
			if !cp.IsDir() || strings.HasPrefix(cp.Name(), ".") {
				continue
			}
			if _, err := os.Stat(u.storedPath(sb.Name(), cp.Name())); err == nil {
				continue
			}
			u.queueIDs(sb.Name(), cp.Name())
			n++
		}
	}
	sleeps := u.resumeSleeps()
	if n > 0 || sleeps > 0 {
		u.log.Info("uploading checkpoints not stored yet", "checkpoints", n, "sleep_images", sleeps)
	}
}

// Run uploads what is queued until ctx ends, trying a failed upload again
// after a wait that doubles.
func (u *Uploader) Run(ctx context.Context) {
	wait := u.cfg.Retry
	for {
		u.mu.Lock()
		var name string
		var j *upload
		for len(u.queue) > 0 && j == nil {
			name, u.queue = u.queue[0], u.queue[1:]
			j = u.jobs[name] // nil: forgotten since
		}
		u.mu.Unlock()
		if j == nil {
			select {
			case <-u.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		err := u.upload(ctx, name, j)
		u.mu.Lock()
		switch {
		case j.forgotten:
		case err == nil:
			delete(u.jobs, name)
			close(j.stored)
		case errors.Is(err, store.ErrNotFound):
			// Its record is gone (deleted meanwhile): nothing to store.
			delete(u.jobs, name)
			j.forgotten = true
			close(j.stored)
		default:
			j.err = err.Error()
			u.queue = append(u.queue, name)
		}
		u.mu.Unlock()
		if err == nil || errors.Is(err, store.ErrNotFound) {
			wait = u.cfg.Retry
			continue
		}
		if ctx.Err() != nil {
			return
		}
		u.log.Warn("uploading a checkpoint", "manifest", name, "err", err, "retry_in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		wait = min(2*wait, 10*time.Minute)
	}
}

// upload stores one checkpoint: its archive written to uploads/, the
// archive's blob, its manifest, then the mark beside its data.
func (u *Uploader) upload(ctx context.Context, name string, j *upload) error {
	if j.sleep {
		return u.uploadSleep(ctx, name, j)
	}
	cp, err := u.cfg.Records.GetCheckpoint(ctx, j.sandbox, j.cp)
	if err != nil {
		return fmt.Errorf("uploading %s: %w", name, err)
	}
	start := time.Now()
	mem := ""
	if cp.Memory {
		mem = filepath.Join(checkpoint.Dir(u.cfg.DataDir, j.sandbox, j.cp), checkpoint.MemDir)
	}
	files := map[string]objects.Blob{}
	disk := u.cfg.Disks.SnapshotPath(checkpoint.Snapshot(j.sandbox, j.cp))
	var base *checkpoint.Base
	b, err := u.putArchive(ctx, j, j.sandbox+"."+j.cp, func(w io.Writer) error {
		var baseBlob objects.Blob
		var err error
		base, baseBlob, err = u.writeArchive(ctx, w, name, cp, disk, mem)
		if base != nil {
			files[baseFile] = baseBlob
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("uploading %s: %w", name, err)
	}
	files[archiveFile] = b
	meta, err := json.Marshal(StoredMeta{Sandbox: j.sandbox, Checkpoint: j.cp, Memory: cp.Memory, Template: cp.Template,
		Image: cp.Image, Resources: cp.Resources, AgentGen: cp.AgentGen,
		Node: u.cfg.Node, Runsc: u.cfg.Runsc, CPUFeatures: u.features(), Base: base})
	if err != nil {
		return err
	}
	u.mu.Lock()
	gone := j.forgotten
	u.mu.Unlock()
	if gone {
		return nil // deleted while it uploaded: no manifest (the sweep takes the blob)
	}
	if err := u.cfg.Objects.PutManifest(ctx, name, &objects.Manifest{Files: files, Meta: meta}); err != nil {
		return fmt.Errorf("uploading %s: %w", name, err)
	}
	mark, _ := json.Marshal(map[string]any{"manifest": name, "blob": b})
	if err := atomicfile.WriteFile(u.storedPath(j.sandbox, j.cp), mark, 0o600); err != nil {
		return fmt.Errorf("uploading %s: marking it stored: %w", name, err)
	}
	diffOf := ""
	if base != nil {
		diffOf = base.Name
	}
	u.log.Info("checkpoint stored", "sandbox", j.sandbox, "checkpoint", j.cp, "bytes", b.Size, "diff_of", diffOf,
		"ms", time.Since(start).Milliseconds(), "objects", u.cfg.Objects.String())
	return nil
}

// writeArchive writes the archive of checkpoint cp (manifest name) to
// w: its disk snapshot at disk and, unless mem is "", the memory image
// there. The disk is a diff against its template when the template can
// be its base (storeBase), which it returns with the base's blob, else
// whole (no base).
func (u *Uploader) writeArchive(ctx context.Context, w io.Writer, name string, cp *store.Checkpoint, disk, mem string) (*checkpoint.Base, objects.Blob, error) {
	man := checkpoint.Manifest{Template: cp.Template, Image: cp.Image, Resources: cp.Resources,
		From: cp.SandboxName + "/" + cp.ID, CreatedAt: cp.CreatedAt}
	if cp.Image != "" {
		// An image's sandbox is stored whole: its template is this
		// node's name for the image, not in its record.
		return nil, objects.Blob{}, checkpoint.WriteArchive(ctx, w, man, disk, mem)
	}
	base, blob, err := u.storeBase(ctx, cp.Template)
	if err != nil {
		// Whole, then: a template this node cannot read or store must
		// not keep its checkpoints from being stored.
		u.log.Warn("storing a checkpoint whole: its template cannot be its base", "manifest", name, "template", cp.Template, "err", err)
	}
	if err != nil || base == nil {
		return nil, objects.Blob{}, checkpoint.WriteArchive(ctx, w, man, disk, mem)
	}
	if err := checkpoint.WriteDiff(ctx, w, man, disk, mem, u.cfg.Disks.TemplatePath(base.Name), *base); err != nil {
		return nil, objects.Blob{}, err
	}
	// The template made again meanwhile (an image's, say) is another
	// base: the next try diffs against that one.
	if rec, err := u.digest(ctx, base.Name); err != nil || rec.Digest != base.Digest {
		return nil, objects.Blob{}, errors.Join(fmt.Errorf("template %s changed while the checkpoint's diff against it was written", base.Name), err)
	}
	return base, blob, nil

}

// putArchive writes an archive (write) to uploads/ and stores it as a
// blob, telling j of its progress.
func (u *Uploader) putArchive(ctx context.Context, j *upload, label string, write func(w io.Writer) error) (objects.Blob, error) {
	dir := filepath.Join(u.cfg.DataDir, "uploads")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return objects.Blob{}, err
	}
	f, err := os.CreateTemp(dir, label+".*.tar.zst")
	if err != nil {
		return objects.Blob{}, err
	}
	defer os.Remove(f.Name())
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return objects.Blob{}, err
	}
	info, err := os.Stat(f.Name())
	if err != nil {
		return objects.Blob{}, err
	}
	u.mu.Lock()
	j.total, j.done = info.Size(), 0
	u.mu.Unlock()
	return u.cfg.Objects.PutFile(ctx, f.Name(), func(n int64) {
		u.mu.Lock()
		j.done = n
		u.mu.Unlock()
	})
}

// features are the CPU features for a manifest (UploaderConfig.CPUFeatures).
func (u *Uploader) features() []string {
	if u.cfg.CPUFeatures == nil {
		return nil
	}
	return u.cfg.CPUFeatures()
}

// Sweep deletes from the object store what no record names: the
// manifests of checkpoints whose records are gone (a delete whose
// Forget failed, a crash between the two), then the blobs no manifest
// names that are older than grace.
func (u *Uploader) Sweep(ctx context.Context, grace time.Duration) error {
	names, err := u.cfg.Objects.Manifests(ctx, "checkpoints/")
	if err != nil {
		return err
	}
	for _, name := range names {
		parts := strings.Split(name, "/")
		if len(parts) != 3 {
			continue
		}
		if _, err := u.cfg.Records.GetCheckpoint(ctx, parts[1], parts[2]); errors.Is(err, store.ErrNotFound) {
			if err := u.cfg.Objects.DeleteManifest(ctx, name); err != nil {
				return err
			}
		}
	}
	if err := u.sweepSleeps(ctx); err != nil {
		return err
	}
	u.sweepFetched(ctx)
	n, err := u.cfg.Objects.Sweep(ctx, grace)
	if n > 0 {
		u.log.Info("swept the object store", "blobs_and_uploads", n)
	}
	return err
}

// elsewhere reports whether sandbox id's record is another node's, or on
// no node (unpinned asleep), so that its checkpoints' data here is no
// longer its own node's. Without the sandboxes' records (no cluster), or
// when the record cannot be read, it says no: the data stays.
func (u *Uploader) elsewhere(ctx context.Context, id string) bool {
	if u.cfg.Sandboxes == nil {
		return false
	}
	sb, err := u.cfg.Sandboxes.GetSandbox(ctx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return true // deleted: its checkpoints' records are gone too
	}
	return err == nil && sb.Node != u.cfg.Node
}

// sweepFetched removes the copies this node fetched of other nodes'
// checkpoints (Fetch) whose records are gone: the owner deleted them, or
// their sandbox; so too the checkpoints taken here of a sandbox that has
// moved to another node since (elsewhere); then the templates it made from stored bases that no
// copy left was made from (sweepBases).
func (u *Uploader) sweepFetched(ctx context.Context) {
	sandboxes, err := os.ReadDir(filepath.Join(u.cfg.DataDir, "checkpoints"))
	// Unless every mark was read, any base may be in use.
	complete := err == nil || errors.Is(err, fs.ErrNotExist)
	used := map[string]bool{}
	for _, sb := range sandboxes {
		cps, err := os.ReadDir(checkpoint.SandboxDir(u.cfg.DataDir, sb.Name()))
		if err != nil {
			complete = false
		}
		away := u.elsewhere(ctx, sb.Name())
		for _, cp := range cps {
			var mark fetchedMark
			b, err := os.ReadFile(u.storedPath(sb.Name(), cp.Name()))
			switch {
			case err == nil:
				if json.Unmarshal(b, &mark) != nil {
					continue
				}
			case !errors.Is(err, fs.ErrNotExist):
				complete = false
				continue
			}
			// A checkpoint taken here is its sandbox's to remove, unless
			// the sandbox runs elsewhere now (moved, or taken over):
			// then what it left here is a copy like a fetched one.
			if !mark.Fetched && !away {
				continue
			}
			if _, err := u.cfg.Records.GetCheckpoint(ctx, sb.Name(), cp.Name()); !errors.Is(err, store.ErrNotFound) {
				used[mark.BaseTemplate] = true
				continue
			}
			err = errors.Join(u.cfg.Disks.DeleteSnapshot(ctx, checkpoint.Snapshot(sb.Name(), cp.Name())),
				os.RemoveAll(checkpoint.Dir(u.cfg.DataDir, sb.Name(), cp.Name())))
			if err != nil {
				used[mark.BaseTemplate] = true
				u.log.Warn("removing a fetched checkpoint whose record is gone", "sandbox", sb.Name(), "checkpoint", cp.Name(), "err", err)
			}
		}
	}
	if complete {
		u.sweepBases(ctx, used)
	}
}
