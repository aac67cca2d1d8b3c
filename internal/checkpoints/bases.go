package checkpoints

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/objects"
)

// A checkpoint's disk is stored as a diff against its template when the
// template is on the node that took it (checkpoint.WriteDiff): a sandbox
// that changed 1% of its disk stores about 1% of it. The template is not
// the same btrfs subvolume on two nodes (each builds or imports its own),
// so the diff is of trees, not `btrfs send -p`, and its base is named by
// its content (checkpoint.TreeDigest). The template itself is stored too,
// whole, once per digest (baseFile, the same blob in every checkpoint of
// it): a node whose template of that name holds other bytes, or that has
// none, fetches it and keeps it as a template of its own (storedTemplate),
// and every checkpoint's manifest names it, so that the sweep keeps it as
// long as one of them is stored.

// baseFile is a diff checkpoint's second file: its base template, whole
// (checkpoint.WriteArchive).
const baseFile = "base.tar.zst"

// digestsDir, in the data dir, keeps the digests of this node's
// templates, computed once per build of each (templates are immutable).
const digestsDir = "template-digests"

// storedTemplatePrefix names the templates this node made from a stored
// base: "stored-" and the hex of its digest.
const storedTemplatePrefix = "stored-"

// templateDigest is what this node knows of one build of a template.
type templateDigest struct {
	// Build is the template's root's identity (templateBuild): another
	// build under the same name has another.
	Build  string `json:"build"`
	Digest string `json:"digest"`
	// Blob is the template's archive in the object store, once stored.
	Blob *objects.Blob `json:"blob,omitempty"`
}

// templateBuild identifies the tree at root: its inode, birth and change
// times, which a template deleted and made again under its name does
// not keep.
func templateBuild(root string) (string, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, root, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_BTIME|unix.STATX_CTIME, &stx); err != nil {
		return "", fmt.Errorf("reading template %s: %w", root, err)
	}
	return fmt.Sprintf("%d %d.%d %d.%d", stx.Ino, stx.Btime.Sec, stx.Btime.Nsec, stx.Ctime.Sec, stx.Ctime.Nsec), nil
}

func (u *Uploader) digestPath(name string) string {
	return filepath.Join(u.cfg.DataDir, digestsDir, name+".json")
}

// digest is template name's digest on this node, computed once per
// build (it reads the whole template), one at a time.
func (u *Uploader) digest(ctx context.Context, name string) (templateDigest, error) {
	u.digestMu.Lock()
	defer u.digestMu.Unlock()
	root := u.cfg.Disks.TemplatePath(name)
	build, err := templateBuild(root)
	if err != nil {
		return templateDigest{}, err
	}
	var rec templateDigest
	if b, err := os.ReadFile(u.digestPath(name)); err == nil && json.Unmarshal(b, &rec) == nil && rec.Build == build {
		return rec, nil
	}
	start := time.Now()
	d, err := checkpoint.TreeDigest(ctx, root)
	if err != nil {
		return templateDigest{}, err
	}
	if again, err := templateBuild(root); err != nil || again != build {
		return templateDigest{}, fmt.Errorf("template %s changed while its digest was taken", name)
	}
	rec = templateDigest{Build: build, Digest: d}
	if err := u.saveDigest(name, rec); err != nil {
		return templateDigest{}, err
	}
	u.log.Info("template digest", "template", name, "digest", d, "ms", time.Since(start).Milliseconds())
	return rec, nil
}

func (u *Uploader) saveDigest(name string, rec templateDigest) error {
	if err := os.MkdirAll(filepath.Join(u.cfg.DataDir, digestsDir), 0o700); err != nil {
		return err
	}
	body, _ := json.Marshal(rec)
	return atomicfile.WriteFile(u.digestPath(name), body, 0o600)
}

// storeBase makes sure template name, a checkpoint's base, is in the
// object store, and returns it with its blob; nil when the template is
// not on this node (the checkpoint is then stored whole).
func (u *Uploader) storeBase(ctx context.Context, name string) (*checkpoint.Base, objects.Blob, error) {
	if name == "" {
		return nil, objects.Blob{}, nil
	}
	if ok, err := u.cfg.Disks.HasTemplate(ctx, name); err != nil || !ok {
		return nil, objects.Blob{}, err
	}
	rec, err := u.digest(ctx, name)
	if err != nil {
		return nil, objects.Blob{}, err
	}
	base := &checkpoint.Base{Name: name, Digest: rec.Digest}
	if rec.Blob != nil {
		if ok, err := u.cfg.Objects.Has(ctx, *rec.Blob); err != nil {
			return nil, objects.Blob{}, err
		} else if ok {
			return base, *rec.Blob, nil
		}
	}
	f, err := os.CreateTemp(filepath.Join(u.cfg.DataDir, "uploads"), "template."+name+".*.tar.zst")
	if err != nil {
		return nil, objects.Blob{}, err
	}
	defer os.Remove(f.Name())
	err = checkpoint.WriteArchive(ctx, f, checkpoint.Manifest{Name: name, CreatedAt: time.Now().UTC()}, u.cfg.Disks.TemplatePath(name), "")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, objects.Blob{}, fmt.Errorf("storing template %s: %w", name, err)
	}
	b, err := u.cfg.Objects.PutFile(ctx, f.Name(), nil)
	if err != nil {
		return nil, objects.Blob{}, fmt.Errorf("storing template %s: %w", name, err)
	}
	u.digestMu.Lock()
	rec.Blob = &b
	err = u.saveDigest(name, rec)
	u.digestMu.Unlock()
	if err != nil {
		return nil, objects.Blob{}, err
	}
	u.log.Info("template stored", "template", name, "digest", rec.Digest, "bytes", b.Size)
	return base, b, nil
}

// baseTemplate is the template of this node a diff against base applies
// to: its own of that name when it is the same tree, else the one made
// from the stored base (m's baseFile), fetched and made the first time.
// Until the caller calls unlock (once it has cloned it), the sweep does
// not delete it (sweepBases).
func (u *Uploader) baseTemplate(ctx context.Context, m *objects.Manifest, base checkpoint.Base, staging string) (name string, unlock func(), err error) {
	if ok, err := u.cfg.Disks.HasTemplate(ctx, base.Name); err != nil {
		return "", nil, err
	} else if ok {
		rec, err := u.digest(ctx, base.Name)
		if err != nil {
			return "", nil, err
		}
		if rec.Digest == base.Digest {
			return base.Name, func() {}, nil
		}
	}
	hexSum, ok := strings.CutPrefix(base.Digest, "sha256:")
	if !ok || len(hexSum) != 64 || strings.Trim(hexSum, "0123456789abcdef") != "" {
		return "", nil, fmt.Errorf("its base %q: %w", base.Digest, objects.ErrCorrupt)
	}
	name = storedTemplatePrefix + hexSum
	unlock = u.fetching.lock("templates/" + name)
	if err := u.makeBase(ctx, m, base, name, staging); err != nil {
		unlock()
		return "", nil, err
	}
	return name, unlock, nil
}

// makeBase makes template name from m's stored base, unless it is here.
func (u *Uploader) makeBase(ctx context.Context, m *objects.Manifest, base checkpoint.Base, name, staging string) error {
	if ok, err := u.cfg.Disks.HasTemplate(ctx, name); err != nil || ok {
		return err
	}
	blob, ok := m.Files[baseFile]
	if !ok {
		return fmt.Errorf("its manifest names no %s: %w", baseFile, objects.ErrCorrupt)
	}
	start := time.Now()
	f, err := u.open(ctx, blob, filepath.Join(staging, baseFile))
	if err != nil {
		return err
	}
	defer f.Close()
	dir := filepath.Join(staging, "base")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	room, err := room(dir)
	if err != nil {
		return err
	}
	man, err := checkpoint.ReadArchive(ctx, f, dir, room)
	if err != nil {
		return fmt.Errorf("its base template: %w", err)
	}
	if man.Memory {
		return fmt.Errorf("its base template holds a memory image: %w", objects.ErrCorrupt)
	}
	tree := filepath.Join(dir, checkpoint.DiskEntry)
	if d, err := checkpoint.TreeDigest(ctx, tree); err != nil {
		return err
	} else if d != base.Digest {
		return fmt.Errorf("its base template is %s, not %s: %w", d, base.Digest, objects.ErrCorrupt)
	}
	if err := u.cfg.Disks.ImportTemplate(context.WithoutCancel(ctx), name, tree); err != nil && !errors.Is(err, disk.ErrExists) {
		return fmt.Errorf("its base template: %w", err)
	}
	u.log.Info("made a checkpoint's base template from the object store", "template", name, "of", base.Name,
		"bytes", blob.Size, "ms", time.Since(start).Milliseconds())
	return nil
}

// open opens blob b: the node's cached copy, or one fetched to path.
func (u *Uploader) open(ctx context.Context, b objects.Blob, path string) (*os.File, error) {
	if u.cfg.Cache != nil {
		p, err := u.cfg.Cache.Get(ctx, u.cfg.Objects, b)
		if err != nil {
			return nil, err
		}
		path = p
	} else if err := u.cfg.Objects.Fetch(ctx, b, path); err != nil {
		return nil, err
	}
	return os.Open(path)
}

// room is the most an archive unpacked into dir may hold: half the free
// space there.
func room(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize / 2, nil
}

// sweepBases deletes the templates this node made from stored bases
// (baseTemplate) that none of the fetched checkpoints here, used, was
// made from: a checkpoint fetched later against one makes it again.
func (u *Uploader) sweepBases(ctx context.Context, used map[string]bool) {
	pool, ok := u.cfg.Disks.(interface {
		Templates(ctx context.Context) ([]string, error)
		DeleteTemplate(ctx context.Context, name string) error
	})
	if !ok {
		return
	}
	names, err := pool.Templates(ctx)
	if err != nil {
		u.log.Warn("listing templates to sweep the stored bases", "err", err)
		return
	}
	for _, name := range names {
		if !strings.HasPrefix(name, storedTemplatePrefix) || used[name] {
			continue
		}
		unlock := u.fetching.lock("templates/" + name)
		err := pool.DeleteTemplate(ctx, name)
		unlock()
		if err != nil {
			u.log.Warn("deleting a stored base no fetched checkpoint uses", "template", name, "err", err)
			continue
		}
		u.log.Info("deleted a stored base no fetched checkpoint uses", "template", name)
	}
}
