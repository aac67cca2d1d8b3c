package checkpoints

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/store"
)

// Sleep images in the object store: what lets a sleeping sandbox wake on
// any node (the core's adopt). A node that puts a sandbox to sleep stores
// its image and its disk as they are, in one archive as a checkpoint's,
// under sleeps/ID/GEN, GEN being the token generation the sleeping agent
// holds. A wake moves the record's generation on (and drops the stored
// image); a node takes a sandbox over only from the image of the
// generation its record says (postgres.Nodes.TakeOverSleeping), so an
// image of an earlier sleep is never woken, whatever the store still
// holds. The mark that the image is stored (sleepStoredFile) is in the
// sleep dir, which the wake drops.

// sleepStoredFile, in a sleep dir, says its image is stored.
const sleepStoredFile = "stored.json"

// SleepImages are the sleep images on this node's disk (sleep.Images has
// them): what the uploads read of them.
type SleepImages interface {
	Dir(id string) string
	Image(id string) string
	Has(id string) (bool, error)
	HeldGen(id string, fallback int) int
}

// Volumes are where sandboxes' disks are (disk.Pool has it).
type Volumes interface {
	VolumePath(id string) string
}

// SandboxRecords finds a sandbox's record by its id (the store has it).
type SandboxRecords interface {
	GetSandbox(ctx context.Context, org, ref string) (*store.Sandbox, error)
}

// SleepManifestName is the object store's name of the sleep image of
// sandbox sandboxID whose agent holds token generation gen.
func SleepManifestName(sandboxID string, gen int) string {
	return "sleeps/" + sandboxID + "/" + strconv.Itoa(gen)
}

// sleepsOn reports whether the uploader stores sleep images (it was
// given what it needs of them).
func (u *Uploader) sleepsOn() bool {
	return u.cfg.Sleeps != nil && u.cfg.Volumes != nil && u.cfg.Sandboxes != nil
}

// sleepMark is the mark that sandbox id's sleep image is stored.
func (u *Uploader) sleepMark(id string) string {
	return filepath.Join(u.cfg.Sleeps.Dir(id), sleepStoredFile)
}

// QueueSleep stores the sleep image of sandbox id, asleep, in the
// background (sandbox.SleepStore).
func (u *Uploader) QueueSleep(id string) {
	if !u.sleepsOn() {
		return
	}
	u.queueSleep(id)
}

func (u *Uploader) queueSleep(id string) *upload {
	gen := u.cfg.Sleeps.HeldGen(id, -1)
	name := SleepManifestName(id, gen)
	u.mu.Lock()
	defer u.mu.Unlock()
	if j, ok := u.jobs[name]; ok {
		return j
	}
	j := &upload{sandbox: id, sleepGen: gen, sleep: true, stored: make(chan struct{})}
	u.jobs[name] = j
	u.queue = append(u.queue, name)
	select {
	case u.wake <- struct{}{}:
	default:
	}
	return j
}

// ForgetSleep drops sandbox id's stored sleep image, as it wakes
// (sandbox.SleepStore): its upload, if under way, stops counting, and its
// objects go in the background (an object store that does not answer must
// not hold up a wake; an image left there is of a generation the record
// has left behind, which nothing wakes, and the sweep's).
func (u *Uploader) ForgetSleep(id string) {
	if !u.sleepsOn() {
		return
	}
	prefix := "sleeps/" + id + "/"
	u.mu.Lock()
	for name, j := range u.jobs {
		if strings.HasPrefix(name, prefix) {
			j.forgotten = true
			delete(u.jobs, name)
			close(j.stored)
		}
	}
	u.mu.Unlock()
	_ = os.Remove(u.sleepMark(id))
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		names, err := u.cfg.Objects.Manifests(ctx, prefix)
		if err != nil {
			u.log.Warn("listing a woken sandbox's stored sleep images", "sandbox", id, "err", err)
			return
		}
		for _, name := range names {
			if err := u.cfg.Objects.DeleteManifest(ctx, name); err != nil {
				u.log.Warn("deleting a woken sandbox's stored sleep image", "manifest", name, "err", err)
			}
		}
	}()
}

// WaitSleep returns once sandbox id's sleep image is stored (queued first
// if it is not), or ctx ends (sandbox.SleepStore).
func (u *Uploader) WaitSleep(ctx context.Context, id string) error {
	if !u.sleepsOn() {
		return api.Errorf(api.CodeUnavailable, "this node does not store sleep images")
	}
	if _, err := os.Stat(u.sleepMark(id)); err == nil {
		return nil
	}
	j := u.queueSleep(id)
	select {
	case <-j.stored:
		u.mu.Lock()
		gone, why := j.forgotten, j.err
		u.mu.Unlock()
		if gone {
			if why == "" {
				why = "it woke meanwhile"
			}
			return api.Errorf(api.CodeConflict, "the sleep image of sandbox %s was not stored: %s", id, why)
		}
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// SleepStored asks the object store whether sleeping sandbox sb's image,
// of the generation its record says, is there, complete.
func (u *Uploader) SleepStored(ctx context.Context, sb *store.Sandbox) bool {
	if !u.sleepsOn() || sb.State != api.StateSleeping {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	_, err := u.cfg.Objects.GetManifest(ctx, SleepManifestName(sb.ID, sb.AgentGen))
	return err == nil
}

// uploadSleep stores a sleep image: its memory image and the sandbox's
// disk, which nothing writes while it sleeps (a wake forgets the upload
// before it restores the sandbox, so an archive the wake overtook never
// gets its manifest). Only the image of the generation the record says
// is stored: one the record has left behind (woken since, or a memory
// checkpoint taken while it slept moved it on) is not.
func (u *Uploader) uploadSleep(ctx context.Context, name string, j *upload) error {
	sb, err := u.cfg.Sandboxes.GetSandbox(ctx, "", j.sandbox)
	if err != nil {
		return fmt.Errorf("uploading %s: %w", name, err)
	}
	if sb.State != api.StateSleeping || sb.AgentGen != j.sleepGen || sb.Node != u.cfg.Node {
		u.mu.Lock()
		j.err = "its sandbox does not sleep with this image any more"
		u.mu.Unlock()
		return fmt.Errorf("uploading %s: %w", name, store.ErrNotFound)
	}
	start := time.Now()
	man := checkpoint.Manifest{Template: sb.Template, Image: sb.Image, Resources: sb.Resources,
		From: sb.Name + "/sleep", CreatedAt: time.Now().UTC()}
	// Whole, not a diff against its template: a sleep image is stored
	// once and used once.
	b, err := u.putArchive(ctx, j, j.sandbox+".sleep", func(w io.Writer) error {
		return checkpoint.WriteArchive(ctx, w, man, u.cfg.Volumes.VolumePath(j.sandbox), u.cfg.Sleeps.Image(j.sandbox))
	})
	if err != nil {
		return fmt.Errorf("uploading %s: %w", name, err)
	}
	meta, err := json.Marshal(StoredMeta{Sandbox: j.sandbox, Checkpoint: "sleep", Memory: true, Template: sb.Template,
		Image: sb.Image, Resources: sb.Resources, AgentGen: j.sleepGen,
		Node: u.cfg.Node, Runsc: u.cfg.Runsc, CPUFeatures: u.features()})
	if err != nil {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	// Under the lock ForgetSleep takes: a wake that began meanwhile
	// finds either no manifest yet (and none comes) or this one, which
	// it deletes.
	if j.forgotten {
		return nil
	}
	// Bounded: a wake waits for the lock.
	pctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	if err := u.cfg.Objects.PutManifest(pctx, name, &objects.Manifest{Files: map[string]objects.Blob{archiveFile: b}, Meta: meta}); err != nil {
		return fmt.Errorf("uploading %s: %w", name, err)
	}
	mark, _ := json.Marshal(map[string]any{"manifest": name, "blob": b})
	if err := atomicfile.WriteFile(u.sleepMark(j.sandbox), mark, 0o600); err != nil {
		return fmt.Errorf("uploading %s: marking it stored: %w", name, err)
	}
	u.log.Info("sleep image stored", "sandbox", j.sandbox, "gen", j.sleepGen, "bytes", b.Size,
		"ms", time.Since(start).Milliseconds(), "objects", u.cfg.Objects.String())
	return nil
}

// FetchSleep fetches sleeping sandbox sb's stored image, of the
// generation its record says, into dest, a new directory of this node's
// (sandbox.SleepStore): the disk as it slept (dest/disk) and its memory
// image (dest/mem), checked whole. One taken with another runsc build,
// or with CPU features this host lacks, is refused, as a checkpoint's.
func (u *Uploader) FetchSleep(ctx context.Context, sb *store.Sandbox, dest string) (diskDir, memDir string, err error) {
	if !u.sleepsOn() {
		return "", "", api.Errorf(api.CodeUnavailable, "this node does not store sleep images")
	}
	name := SleepManifestName(sb.ID, sb.AgentGen)
	m, err := u.cfg.Objects.GetManifest(ctx, name)
	if errors.Is(err, objects.ErrNotFound) {
		return "", "", api.Errorf(api.CodeUnavailable, "sandbox %s sleeps on node %s, which does not answer, and its sleep image is not in the object store: restore one of its stored checkpoints", sb.Name, sb.Node)
	}
	if err != nil {
		return "", "", fmt.Errorf("fetching the sleep image of %s: %w", sb.Name, err)
	}
	var meta StoredMeta
	if err := json.Unmarshal(m.Meta, &meta); err != nil {
		return "", "", fmt.Errorf("fetching the sleep image of %s: its manifest: %w: %v", sb.Name, objects.ErrCorrupt, err)
	}
	if meta.Sandbox != sb.ID || meta.AgentGen != sb.AgentGen {
		return "", "", fmt.Errorf("fetching the sleep image of %s: its manifest is another's: %w", sb.Name, objects.ErrCorrupt)
	}
	if err := u.compatible(&store.Checkpoint{Checkpoint: api.Checkpoint{ID: "its sleep image", Memory: true}}, meta); err != nil {
		return "", "", err
	}
	blob, ok := m.Files[archiveFile]
	if !ok {
		return "", "", fmt.Errorf("fetching the sleep image of %s: its manifest names no %s: %w", sb.Name, archiveFile, objects.ErrCorrupt)
	}
	unpacked, err := u.unpack(ctx, blob, dest)
	if errors.Is(err, objects.ErrCorrupt) {
		return "", "", api.Errorf(api.CodeUnavailable, "the stored sleep image of %s is corrupt (it failed its checksum): restore one of its stored checkpoints", sb.Name)
	}
	if err != nil {
		return "", "", fmt.Errorf("fetching the sleep image of %s: %w", sb.Name, err)
	}
	return filepath.Join(unpacked, checkpoint.DiskEntry), filepath.Join(unpacked, checkpoint.MemEntry), nil
}

// unpack fetches a whole archive blob (through the node's cache, checked
// against its digest) and unpacks it, checked whole, into
// staging/unpacked, which it answers.
func (u *Uploader) unpack(ctx context.Context, blob objects.Blob, staging string) (string, error) {
	f, err := u.open(ctx, blob, filepath.Join(staging, archiveFile))
	if err != nil {
		return "", err
	}
	defer f.Close()
	unpacked := filepath.Join(staging, "unpacked")
	if err := os.Mkdir(unpacked, 0o700); err != nil {
		return "", err
	}
	room, err := room(unpacked)
	if err != nil {
		return "", err
	}
	if _, err := checkpoint.ReadArchive(ctx, f, unpacked, room); err != nil {
		return "", err
	}
	return unpacked, nil
}

// resumeSleeps queues the sleep images on this node's disk that are not
// stored: those of sandboxes that went to sleep before a restart.
func (u *Uploader) resumeSleeps() int {
	if !u.sleepsOn() {
		return 0
	}
	ents, _ := os.ReadDir(filepath.Join(u.cfg.DataDir, "sandboxes"))
	n := 0
	for _, e := range ents {
		if has, _ := u.cfg.Sleeps.Has(e.Name()); !has {
			continue
		}
		if _, err := os.Stat(u.sleepMark(e.Name())); err == nil {
			continue
		}
		u.queueSleep(e.Name())
		n++
	}
	return n
}

// sweepSleeps deletes the stored sleep images no sandbox sleeps with: its
// record gone, or of another generation than the record's.
func (u *Uploader) sweepSleeps(ctx context.Context) error {
	if !u.sleepsOn() {
		return nil
	}
	names, err := u.cfg.Objects.Manifests(ctx, "sleeps/")
	if err != nil {
		return err
	}
	for _, name := range names {
		parts := strings.Split(name, "/")
		if len(parts) != 3 {
			continue
		}
		sb, err := u.cfg.Sandboxes.GetSandbox(ctx, "", parts[1])
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err == nil && strconv.Itoa(sb.AgentGen) == parts[2] && sb.State == api.StateSleeping {
			continue
		}
		if err := u.cfg.Objects.DeleteManifest(ctx, name); err != nil {
			return err
		}
	}
	return nil
}
