package checkpoints

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/objects"
	"loam.dev/loam/internal/store"
)

// Fetcher brings a checkpoint another node took here from the object
// store, for a fork (the Uploader has it).
type Fetcher interface {
	// Fetch makes checkpoint cp of sandbox src usable on this node as
	// one of its own is: its disk a snapshot in the pool, its memory
	// image under its directory (checkpoint.Dir); a no-op when it is here.
	Fetch(ctx context.Context, src *store.Sandbox, cp *store.Checkpoint) error
}

// fetches keeps one fetch of a checkpoint at a time.
type fetches struct {
	mu sync.Mutex
	by map[string]*sync.Mutex
}

func (f *fetches) lock(name string) func() {
	f.mu.Lock()
	if f.by == nil {
		f.by = map[string]*sync.Mutex{}
	}
	l, ok := f.by[name]
	if !ok {
		l = &sync.Mutex{}
		f.by[name] = l
	}
	f.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Stored reports whether checkpoint ref of sandbox sandboxID is in the
// object store, complete (its manifest is there): any node may then fetch
// it (cluster.StoredCheckpoints).
func (u *Uploader) Stored(ctx context.Context, sandboxID, ref string) (bool, error) {
	cp, err := u.cfg.Records.GetCheckpoint(ctx, sandboxID, ref)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	_, err = u.cfg.Objects.GetManifest(ctx, ManifestName(sandboxID, cp.ID))
	return err == nil, nil
}

// Fetch brings checkpoint cp of src here from the object store (Fetcher):
// its archive (through the node's cache, checked against its digest),
// unpacked and checked whole into a directory of its own, its disk then
// imported into the pool and its memory image moved into place, and last
// the mark that it is stored, which also keeps Resume from uploading it
// again. A memory checkpoint taken with another runsc build, or with CPU
// features this host lacks, is refused: it would not restore here. A
// stored copy that fails its checksum is refused too (unavailable), and
// nothing of it is kept, in the cache or elsewhere: the next fetch reads
// the store again.
func (u *Uploader) Fetch(ctx context.Context, src *store.Sandbox, cp *store.Checkpoint) error {
	err := u.fetch(ctx, src, cp)
	if errors.Is(err, objects.ErrCorrupt) {
		u.log.Error("a stored checkpoint failed its checksum", "sandbox", src.ID, "checkpoint", cp.ID, "err", err)
		return api.Errorf(api.CodeUnavailable, "checkpoint %s of %s: its copy in the object store is corrupt (it failed its checksum), so node %s made nothing from it; the copy on node %s, its sandbox's, is not affected",
			cp.ID, src.Name, u.cfg.Node, src.Node)
	}
	return err
}

func (u *Uploader) fetch(ctx context.Context, src *store.Sandbox, cp *store.Checkpoint) error {
	name := ManifestName(src.ID, cp.ID)
	mark := u.storedPath(src.ID, cp.ID)
	if _, err := os.Stat(mark); err == nil {
		return nil
	}
	defer u.fetching.lock(name)()
	if _, err := os.Stat(mark); err == nil {
		return nil // fetched by another fork meanwhile
	}
	start := time.Now()
	m, err := u.cfg.Objects.GetManifest(ctx, name)
	if errors.Is(err, objects.ErrNotFound) {
		return api.Errorf(api.CodeUnavailable, "checkpoint %s of %s is on node %s alone: it is not in the object store (yet: it is uploaded once taken)", cp.ID, src.Name, src.Node)
	}
	if err != nil {
		return fmt.Errorf("fetching checkpoint %s of %s: %w", cp.ID, src.Name, err)
	}
	var meta StoredMeta
	if err := json.Unmarshal(m.Meta, &meta); err != nil {
		return fmt.Errorf("fetching checkpoint %s of %s: its manifest: %w: %v", cp.ID, src.Name, objects.ErrCorrupt, err)
	}
	if err := u.compatible(cp, meta); err != nil {
		return err
	}
	blob, ok := m.Files[archiveFile]
	if !ok {
		return fmt.Errorf("fetching checkpoint %s of %s: its manifest names no %s: %w", cp.ID, src.Name, archiveFile, objects.ErrCorrupt)
	}
	work := filepath.Join(u.cfg.DataDir, "fetch")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	staging, err := os.MkdirTemp(work, src.ID+"."+cp.ID+".")
	if err != nil {
		return err
	}
	defer os.RemoveAll(staging)
	f, err := u.open(ctx, blob, filepath.Join(staging, archiveFile))
	if err != nil {
		return fmt.Errorf("fetching checkpoint %s of %s: %w", cp.ID, src.Name, err)
	}
	defer f.Close()
	unpacked := filepath.Join(staging, "unpacked")
	if err := os.Mkdir(unpacked, 0o700); err != nil {
		return err
	}
	room, err := room(unpacked)
	if err != nil {
		return err
	}
	snap := checkpoint.Snapshot(src.ID, cp.ID)
	snaps, err := u.cfg.Disks.Snapshots(ctx)
	if err != nil {
		return err
	}
	have := slices.Contains(snaps, snap)
	tpl := ""
	if meta.Base != nil {
		tpl, err = u.applyDiff(ctx, m, *meta.Base, f, staging, unpacked, snap, have, room)
	} else {
		err = u.unpackWhole(ctx, f, unpacked, snap, have, room)
	}
	if err != nil {
		return fmt.Errorf("fetching checkpoint %s of %s: %w", cp.ID, src.Name, err)
	}
	ctx = context.WithoutCancel(ctx)
	dir := checkpoint.Dir(u.cfg.DataDir, src.ID, cp.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if cp.Memory {
		mem := filepath.Join(dir, checkpoint.MemDir)
		if err := os.RemoveAll(mem); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(unpacked, checkpoint.MemEntry), mem); err != nil {
			return fmt.Errorf("fetching checkpoint %s of %s: its memory image: %w", cp.ID, src.Name, err)
		}
		if err := checkpoint.SyncTree(mem); err != nil {
			return err
		}
	}
	body, _ := json.Marshal(fetchedMark{Manifest: name, Blob: blob, Fetched: true, BaseTemplate: tpl})
	if err := atomicfile.WriteFile(mark, body, 0o600); err != nil {
		return err
	}
	u.log.Info("fetched a checkpoint", "sandbox", src.ID, "checkpoint", cp.ID, "from_node", meta.Node,
		"bytes", blob.Size, "ms", time.Since(start).Milliseconds())
	return nil
}

// unpackWhole unpacks a whole archive into unpacked and, unless have,
// makes snapshot snap of its disk.
func (u *Uploader) unpackWhole(ctx context.Context, f *os.File, unpacked, snap string, have bool, room int64) error {
	if _, err := checkpoint.ReadArchive(ctx, f, unpacked, room); err != nil {
		return err
	}
	if have {
		return nil
	}
	if err := u.cfg.Disks.ImportSnapshot(context.WithoutCancel(ctx), snap, filepath.Join(unpacked, checkpoint.DiskEntry)); err != nil {
		return fmt.Errorf("its disk: %w", err)
	}
	return nil
}

// fetchedMark is the stored mark (storedFile) of a fetched checkpoint.
type fetchedMark struct {
	Manifest string       `json:"manifest"`
	Blob     objects.Blob `json:"blob"`
	Fetched  bool         `json:"fetched"`
	// BaseTemplate is the template a diff was applied to, which the
	// sweep keeps while the checkpoint is here (sweepBases).
	BaseTemplate string `json:"base_template,omitempty"`
}

// applyDiff applies a diff archive against base to a volume cloned from
// this node's template of that tree (baseTemplate), which it returns,
// and, unless have, makes snapshot snap of it; its memory image goes
// into unpacked. The volume goes either way (a crash leaves it to the
// recovery's sweep of volumes no sandbox has).
func (u *Uploader) applyDiff(ctx context.Context, m *objects.Manifest, base checkpoint.Base, f *os.File, staging, unpacked, snap string, have bool, room int64) (string, error) {
	tpl, unlock, err := u.baseTemplate(ctx, m, base, staging)
	if err != nil {
		return "", err
	}
	vol := "fetch-" + snap
	if err := u.cfg.Disks.DeleteVolume(ctx, vol); err != nil {
		unlock()
		return "", err
	}
	root, err := u.cfg.Disks.CreateVolume(ctx, vol, tpl)
	unlock() // the clone is the volume's own: the template may go now
	if err != nil {
		return "", fmt.Errorf("its disk: %w", err)
	}
	defer func() {
		if err := u.cfg.Disks.DeleteVolume(context.WithoutCancel(ctx), vol); err != nil {
			u.log.Warn("removing the volume a fetched checkpoint was applied to", "volume", vol, "err", err)
		}
	}()
	if _, err := checkpoint.ApplyDiff(ctx, f, root, unpacked, base, room); err != nil {
		return "", err
	}
	if have {
		return tpl, nil
	}
	ctx = context.WithoutCancel(ctx)
	if err := u.cfg.Disks.Snapshot(ctx, vol, snap); err != nil {
		return "", fmt.Errorf("its disk: %w", err)
	}
	if err := u.cfg.Disks.SyncSnapshot(ctx, snap); err != nil {
		return "", fmt.Errorf("its disk: %w", err)
	}
	return tpl, nil
}

// compatible refuses a memory checkpoint that would not restore on this
// node: taken with another runsc build, or seeing CPU features this host
// lacks. A disk-only one boots anywhere.
func (u *Uploader) compatible(cp *store.Checkpoint, meta StoredMeta) error {
	if !cp.Memory {
		return nil
	}
	if meta.Runsc != "" && u.cfg.Runsc != "" && meta.Runsc != u.cfg.Runsc {
		return api.Errorf(api.CodeConflict, "checkpoint %s was taken with runsc %s on node %s; this node runs %s, and a memory image restores only on the build that took it (fork on a node of that build, or from a disk-only checkpoint)",
			cp.ID, meta.Runsc, meta.Node, u.cfg.Runsc)
	}
	if host := u.cfg.HostFeatures; len(host) > 0 {
		var lacks []string
		for _, f := range meta.CPUFeatures {
			if !slices.Contains(host, f) {
				lacks = append(lacks, f)
			}
		}
		if len(lacks) > 0 {
			return api.Errorf(api.CodeConflict, "checkpoint %s's memory image saw CPU features this node lacks (%s); pin the cluster's (loam serve --cpu-features) so that every node can restore its checkpoints",
				cp.ID, strings.Join(lacks, ", "))
		}
	}
	return nil
}
