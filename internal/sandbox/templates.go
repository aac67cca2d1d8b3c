package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/store"
)

// Checkpoint templates: a checkpoint kept under a name, which outlives its
// sandbox and the checkpoint. Each is a directory
//
//	DATA_DIR/checkpoint-templates/<name>/manifest.json   checkpoint.Manifest
//	DATA_DIR/checkpoint-templates/<name>/mem/            memory image (memory templates)
//
// plus the disk pool's read-only snapshot the manifest names
// (tpl.<name>.<random>). A template is made in a .tmp-… directory beside
// the others and appears by one rename once its snapshot and files are
// durable, and goes by one rename before its data is removed, so a crash
// never leaves a half-made (or half-deleted) template visible: start-up
// sweeps what such a crash left (see sweepTemplates).

// keptDir is the directory of checkpoint templates.
func (m *Manager) keptDir() string { return filepath.Join(m.cfg.DataDir, "checkpoint-templates") }

// templateSnapPrefix starts the name of every template's disk snapshot; no
// checkpoint's snapshot (sandbox id "." checkpoint id) starts with it.
const templateSnapPrefix = "tpl."

var templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// checkTemplateName refuses a name that cannot name a template.
func checkTemplateName(name string) error {
	if !templateNameRE.MatchString(name) {
		return api.Errorf(api.CodeInvalid, "name %q: a template name is 1-63 lower-case letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// readKept reads the manifest of checkpoint template name; nil when there
// is none.
func (m *Manager) readKept(name string) (*checkpoint.Manifest, error) {
	if checkTemplateName(name) != nil {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(m.keptDir(), name, checkpoint.ManifestEntry))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading template %s: %w", name, err)
	}
	var man checkpoint.Manifest
	if err := json.Unmarshal(b, &man); err != nil {
		return nil, fmt.Errorf("reading template %s: %w", name, err)
	}
	man.Name = name
	return &man, nil
}

// listKept reads every checkpoint template, sorted by name.
func (m *Manager) listKept() ([]*checkpoint.Manifest, error) {
	entries, err := os.ReadDir(m.keptDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	var out []*checkpoint.Manifest
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		man, err := m.readKept(e.Name())
		if err != nil {
			return nil, err
		}
		if man != nil {
			out = append(out, man)
		}
	}
	return out, nil
}

// Templates lists the templates sandboxes can be made from: the built-in
// ones, then the checkpoint templates, each with how many sandboxes use it.
func (m *Manager) Templates(ctx context.Context) []api.Template {
	out := m.tpl.List(ctx)
	// One listing counts the uses of both: a sandbox of an image is
	// counted under its image. A warm pool's members are no uses.
	uses, imageUses := map[string]int{}, map[string]int{}
	if sbs, err := m.store.ListSandboxes(ctx, store.Filter{}); err == nil {
		for _, sb := range sbs {
			if sb.Pool != "" {
				continue
			}
			uses[sb.Template]++
			if sb.Image != "" {
				imageUses[sb.Image]++
			}
		}
	} else {
		m.log.Warn("counting the sandboxes of templates", "err", err)
	}
	for i := range out {
		out[i].Uses = uses[out[i].Name]
	}
	kept, err := m.listKept()
	if err != nil {
		m.log.Warn("listing checkpoint templates", "err", err)
	}
	for _, man := range kept {
		out = append(out, m.keptView(man, uses[man.Name]))
	}
	return append(out, m.imageTemplates(ctx, imageUses)...)
}

// imageTemplates are the images the daemon pulled, or is pulling, as
// templates: named by their ref, as a create gives it in "image"; uses
// counts the sandboxes of each.
func (m *Manager) imageTemplates(ctx context.Context, uses map[string]int) []api.Template {
	if m.cfg.Images == nil {
		return nil
	}
	images, err := m.cfg.Images.List(ctx)
	if err != nil {
		m.log.Warn("listing images", "err", err)
		return nil
	}
	var out []api.Template
	for _, im := range images {
		t := api.Template{
			Name: im.Ref, Description: "OCI image " + im.Ref, Kind: api.TemplateImage,
			SizeBytes: im.Size, Uses: uses[im.Ref], CreatedAt: &im.CreatedAt,
		}
		if im.Digest != "" {
			t.Description += " (" + im.Digest + ")"
		}
		switch im.State {
		case api.ImageReady:
			t.Ready, t.State, t.Progress = true, api.TemplateReady, 100
		case api.ImageError:
			t.State, t.Error = api.TemplateFailed, im.Error
		default:
			t.State = api.TemplateBuilding
			if im.Size > 0 {
				t.Progress = min(int(im.Pulled*100/im.Size), 99)
			}
		}
		out = append(out, t)
	}
	return out
}

func (m *Manager) keptView(man *checkpoint.Manifest, uses int) api.Template {
	desc := "disk of checkpoint " + man.From + "; boots fresh"
	if man.Memory {
		desc = "memory and disk of checkpoint " + man.From + "; processes resume"
	}
	created := man.CreatedAt
	return api.Template{
		Name: man.Name, Description: desc, Ready: true,
		Kind: api.TemplateCheckpoint, State: api.TemplateReady, Progress: 100, Memory: man.Memory,
		SizeBytes: man.SizeBytes, Uses: uses, From: man.From, CreatedAt: &created,
	}
}

// isBuiltin reports whether name is a template the daemon provides.
func (m *Manager) isBuiltin(ctx context.Context, name string) bool {
	return slices.ContainsFunc(m.tpl.List(ctx), func(t api.Template) bool { return t.Name == name })
}

// CreateTemplate keeps a checkpoint as template req.Name: a copy-on-write
// copy of its disk snapshot and hard links to its memory image (which is
// never written again), so deleting the checkpoint or its sandbox leaves
// the template whole.
func (m *Manager) CreateTemplate(ctx context.Context, req api.CreateTemplate) (*api.Template, error) {
	leave, err := m.heavy.enter(ctx, "making a template")
	if err != nil {
		return nil, err
	}
	defer leave()
	if err := checkTemplateName(req.Name); err != nil {
		return nil, err
	}
	if err := CheckPoolSize(req.Pool); err != nil {
		return nil, err
	}
	src, cp, unlock, err := m.sourceCheckpoint(ctx, req.From)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ctx = context.WithoutCancel(ctx)
	man := checkpoint.Manifest{
		Format: checkpoint.ManifestFormat, Name: req.Name, Memory: cp.Memory,
		Template: cp.Template, Image: cp.Image, Resources: cp.Resources,
		From: src.Name + "/" + cp.ID, CreatedAt: store.Now(),
	}
	if cp.Memory {
		man.AgentToken = m.heldToken(cp)
	}
	err = m.publishTemplate(ctx, &man, func(tmp, snap string) error {
		// A writable clone of the checkpoint's disk, frozen again as the
		// template's own snapshot: on btrfs both are instant.
		vol := "tplcopy-" + randomHex(6)
		root, err := m.disks.CloneSnapshot(ctx, snapName(src.ID, cp.ID), vol)
		if err != nil {
			return fmt.Errorf("copying the disk: %w", err)
		}
		crash.Point("template.volume")
		// The source's secrets given as files are its own, not the
		// template's: a sandbox of the template gets those it is given.
		err = removeSecretFiles(root, src.SecretFiles)
		if err == nil {
			err = m.disks.Snapshot(ctx, vol, snap)
		}
		if derr := m.disks.DeleteVolume(ctx, vol); err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("copying the disk: %w", err)
		}
		if cp.Memory {
			if err := linkTree(filepath.Join(m.checkpointDir(src.ID, cp.ID), memDir), filepath.Join(tmp, memDir)); err != nil {
				return fmt.Errorf("keeping the memory image: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.log.Info("template made", "template", man.Name, "from", man.From, "memory", man.Memory)
	if req.Pool > 0 {
		if err := m.pools.Keep(ctx, PoolSource{Template: man.Name}, req.Pool); err != nil {
			m.log.Error("keeping the new template's pool", "template", man.Name, "err", err)
		}
	}
	v := m.keptView(&man, 0)
	return &v, nil
}

// publishTemplate makes template man.Name: fill puts its memory image (if
// any) in tmp and its disk in snapshot snap, then the manifest is written
// and all is made durable, and the template appears by one rename. On an
// error nothing is left.
func (m *Manager) publishTemplate(ctx context.Context, man *checkpoint.Manifest, fill func(tmp, snap string) error) (err error) {
	if m.isBuiltin(ctx, man.Name) {
		return api.Errorf(api.CodeConflict, "template %q exists (a built-in)", man.Name)
	}
	if have, err := m.readKept(man.Name); err != nil {
		return err
	} else if have != nil {
		return api.Errorf(api.CodeConflict, "template %q exists", man.Name)
	}
	if err := os.MkdirAll(m.keptDir(), 0o700); err != nil {
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	tmp, err := os.MkdirTemp(m.keptDir(), ".tmp-"+man.Name+"-")
	if err != nil {
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	snap := templateSnapPrefix + man.Name + "." + randomHex(6)
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
			_ = m.disks.DeleteSnapshot(context.WithoutCancel(ctx), snap)
		}
	}()
	if err := fill(tmp, snap); err != nil {
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	crash.Point("template.filled")
	man.Snapshot = snap
	man.SizeBytes = treeBytes(m.disks.SnapshotPath(snap)) + treeBytes(filepath.Join(tmp, memDir))
	body, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, checkpoint.ManifestEntry), body, 0o600); err != nil {
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	if err := syncVolume(m.disks.SnapshotPath(snap)); err != nil {
		return err
	}
	if err := checkpoint.SyncTree(tmp); err != nil {
		return err
	}
	crash.Point("template.synced")
	m.keptMu.Lock()
	defer m.keptMu.Unlock()
	final := filepath.Join(m.keptDir(), man.Name)
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			return api.Errorf(api.CodeConflict, "template %q exists", man.Name)
		}
		return fmt.Errorf("making template %s: %w", man.Name, err)
	}
	return checkpoint.SyncDirs(m.keptDir(), m.cfg.DataDir)
}

// DeleteTemplate deletes checkpoint template name, unless a sandbox uses it.
func (m *Manager) DeleteTemplate(ctx context.Context, name string) error {
	if m.isBuiltin(ctx, name) {
		return api.Errorf(api.CodeForbidden, "template %s is built in and cannot be deleted", name)
	}
	m.keptMu.Lock()
	defer m.keptMu.Unlock()
	man, err := m.readKept(name)
	if err != nil {
		return err
	}
	if man == nil {
		return api.Errorf(api.CodeNotFound, "template %q not found", name)
	}
	sbs, err := m.store.ListSandboxes(ctx, store.Filter{})
	if err != nil {
		return fmt.Errorf("counting the sandboxes of template %s: %w", name, err)
	}
	var users []string
	for _, sb := range sbs {
		if sb.Template == name && sb.Pool == "" {
			users = append(users, sb.Name)
		}
	}
	if len(users) > 0 {
		if len(users) == 1 {
			return api.Errorf(api.CodeConflict, "template %s is used by sandbox %s; delete it first", name, users[0])
		}
		return api.Errorf(api.CodeConflict, "template %s is used by sandboxes %s; delete them first", name, strings.Join(users, ", "))
	}
	m.exportMu.Lock()
	exports := m.exporting[name]
	m.exportMu.Unlock()
	if exports > 0 {
		return api.Errorf(api.CodeConflict, "template %s is being exported; try again when the export ends", name)
	}
	m.pools.Forget(ctx, PoolSource{Template: name})
	// Gone at once by a rename; the data goes after (or at the next start).
	gone := filepath.Join(m.keptDir(), ".del-"+name+"-"+randomHex(6))
	if err := os.Rename(filepath.Join(m.keptDir(), name), gone); err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	crash.Point("template-delete.renamed")
	ctx = context.WithoutCancel(ctx)
	if err := errors.Join(m.disks.DeleteSnapshot(ctx, man.Snapshot), os.RemoveAll(gone)); err != nil {
		m.log.Warn("removing template data", "template", name, "err", err)
	}
	m.log.Info("template deleted", "template", name)
	return nil
}

// createFromTemplate makes a sandbox from checkpoint template man, as a
// fork of its checkpoint: a copy of its disk and, for a memory template,
// its memory, so the template's processes run on in the new sandbox under
// its own id, name, token and identity. From a disk-only template it boots
// fresh on the copy.
func (m *Manager) createFromTemplate(ctx context.Context, req api.CreateSandbox, man *checkpoint.Manifest) (*api.Sandbox, error) {
	if man.Memory && req.Resources != nil {
		return nil, api.Errorf(api.CodeInvalid, "resources: a sandbox of memory template %s takes its resources from the template; don't give them", man.Name)
	}
	if man.Memory && len(req.Services) > 0 {
		return nil, api.Errorf(api.CodeInvalid, "services: a sandbox of memory template %s takes its services from the template's disk; don't give any", man.Name)
	}
	if err := checkServices(req.Services); err != nil {
		return nil, err
	}
	sb, err := m.newRecord(ctx, req)
	if err != nil {
		return nil, err
	}
	sb.Template, sb.Image = man.Name, man.Image
	if man.Memory {
		sb.Resources = man.Resources
	}
	// Held for reading until the sandbox is stored (and counted as a use),
	// so that the template cannot be deleted under it.
	m.keptMu.RLock()
	defer m.keptMu.RUnlock()
	if again, err := m.readKept(man.Name); err != nil || again == nil {
		return nil, api.Errorf(api.CodeNotFound, "template %q not found", man.Name)
	}
	if defaultResources(req) {
		// A memory template gives no services (refused above).
		if v, ok, err := m.pools.Claim(ctx, PoolSource{Template: man.Name}, sb, req.Services); ok {
			return v, err
		}
	}
	end, _ := m.begin(sb, opCreate) // before it is stored: see Create
	defer end()
	if err := m.insert(ctx, sb); err != nil {
		return nil, err
	}
	crash.Point("template-sandbox.stored")
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	if err = m.bootTemplate(ctx, sb, man, req.Services); err != nil {
		m.log.Error("create from template failed", "sandbox", sb.ID, "template", man.Name, "err", err)
		if derr := m.destroy(ctx, sb); derr != nil {
			m.log.Error("cleaning up after failed create", "sandbox", sb.ID, "err", derr)
		}
		var ae *api.Error
		if errors.As(err, &ae) {
			return nil, err
		}
		return nil, publicError(fmt.Errorf("creating sandbox %s from template %s: %w", sb.Name, man.Name, err))
	}
	m.log.Info("sandbox created from template", "sandbox", sb.ID, "name", sb.Name, "template", man.Name, "ms", time.Since(start).Milliseconds())
	return m.view(sb), nil
}

// bootTemplate makes a sandbox from checkpoint template man, with services
// (a disk-only template's: a memory template's are on its disk).
func (m *Manager) bootTemplate(ctx context.Context, sb *store.Sandbox, man *checkpoint.Manifest, services []api.Service) error {
	root, err := m.disks.CloneSnapshot(ctx, man.Snapshot, sb.ID)
	if err != nil {
		return fmt.Errorf("copying the template's disk: %w", err)
	}
	if err := m.limitDisk(ctx, sb); err != nil {
		return fmt.Errorf("copying the template's disk: %w", err)
	}
	crash.Point("template-sandbox.disk")
	if !man.Memory {
		// A fresh boot: the disk names the new sandbox, as a template's does.
		if err := personalize(root, sb.Name); err != nil {
			return fmt.Errorf("making disk: %w", err)
		}
		return m.bootWith(ctx, sb, false, services)
	}
	return m.resumeImage(ctx, sb, filepath.Join(m.keptDir(), man.Name, memDir), man.AgentToken, "template "+man.Name)
}

// ExportTemplate writes checkpoint template name to w as one archive (see
// checkpoint.WriteArchive). The template cannot be deleted meanwhile.
func (m *Manager) ExportTemplate(ctx context.Context, name string, w io.Writer) error {
	m.keptMu.RLock()
	man, err := m.readKept(name)
	if err == nil && man != nil {
		// Marked as being read, so that a delete meanwhile is refused,
		// without holding keptMu for as long as the stream lasts.
		m.exportMu.Lock()
		m.exporting[name]++
		m.exportMu.Unlock()
		defer func() {
			m.exportMu.Lock()
			if m.exporting[name]--; m.exporting[name] == 0 {
				delete(m.exporting, name)
			}
			m.exportMu.Unlock()
		}()
	}
	m.keptMu.RUnlock()
	if err != nil {
		return err
	}
	if man == nil {
		if m.isBuiltin(ctx, name) {
			return api.Errorf(api.CodeInvalid, "template %s is built in: every loam builds it; only checkpoint templates are exported", name)
		}
		return api.Errorf(api.CodeNotFound, "template %q not found", name)
	}
	mem := ""
	if man.Memory {
		mem = filepath.Join(m.keptDir(), name, memDir)
	}
	if err := checkpoint.WriteArchive(ctx, w, *man, m.disks.SnapshotPath(man.Snapshot), mem); err != nil {
		return fmt.Errorf("exporting template %s: %w", name, err)
	}
	return nil
}

// ImportTemplate makes checkpoint template name from an archive written by
// ExportTemplate (on this host or another). The archive is unpacked into a
// temporary directory and checked whole before anything is published: a
// damaged or hostile one is refused (invalid) and leaves nothing.
func (m *Manager) ImportTemplate(ctx context.Context, name string, r io.Reader) (*api.Template, error) {
	leave, err := m.heavy.enter(ctx, "importing a template")
	if err != nil {
		return nil, err
	}
	defer leave()
	if err := checkTemplateName(name); err != nil {
		return nil, err
	}
	if m.isBuiltin(ctx, name) {
		return nil, api.Errorf(api.CodeConflict, "template %q exists (a built-in)", name)
	}
	if have, err := m.readKept(name); err != nil {
		return nil, err
	} else if have != nil {
		return nil, api.Errorf(api.CodeConflict, "template %q exists", name)
	}
	if err := os.MkdirAll(m.keptDir(), 0o700); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(m.keptDir(), ".tmp-import-"+name+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	// The unpacked archive, and then its copy in the disk pool, must leave
	// room on the data dir's filesystem for everything else.
	var st unix.Statfs_t
	if err := unix.Statfs(work, &st); err != nil {
		return nil, fmt.Errorf("importing template %s: %w", name, err)
	}
	room := int64(st.Bavail)*st.Bsize/2 - importReserve
	if room <= 0 {
		return nil, api.Errorf(api.CodeLimit, "importing template %s: the data dir's disk is full", name)
	}
	man, err := checkpoint.ReadArchive(ctx, r, work, room)
	if err != nil {
		return nil, fmt.Errorf("importing template %s: %w", name, err)
	}
	if err := checkResources(man.Resources); err != nil {
		return nil, api.Errorf(api.CodeInvalid, "template archive refused: manifest: %s", err.(*api.Error).Message)
	}
	if man.Memory && man.AgentToken == "" {
		return nil, api.Errorf(api.CodeInvalid, "template archive refused: a memory template without its agent token")
	}
	man.Name = name
	crash.Point("template-import.unpacked")
	ctx = context.WithoutCancel(ctx)
	err = m.publishTemplate(ctx, man, func(tmp, snap string) error {
		if err := m.disks.ImportSnapshot(ctx, snap, filepath.Join(work, checkpoint.DiskEntry)); err != nil {
			return fmt.Errorf("importing the disk: %w", err)
		}
		if man.Memory {
			if err := os.Rename(filepath.Join(work, checkpoint.MemEntry), filepath.Join(tmp, memDir)); err != nil {
				return fmt.Errorf("importing the memory image: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.log.Info("template imported", "template", name, "memory", man.Memory, "bytes", man.SizeBytes)
	v := m.keptView(man, 0)
	return &v, nil
}

// importReserve is the space an import leaves free on the data dir's disk.
const importReserve = 1 << 30

// sweepTemplates removes what a crash left of templates being made or
// deleted, and returns the snapshots the published ones hold.
func (m *Manager) sweepTemplates() (map[string]bool, error) {
	held := map[string]bool{}
	entries, err := os.ReadDir(m.keptDir())
	if errors.Is(err, fs.ErrNotExist) {
		return held, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			m.log.Info("removing unfinished template data", "path", e.Name())
			errs = append(errs, os.RemoveAll(filepath.Join(m.keptDir(), e.Name())))
			continue
		}
		man, err := m.readKept(e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if man != nil {
			held[man.Snapshot] = true
		}
	}
	return held, errors.Join(errs...)
}

// removeSecretFiles removes the files a sandbox's secrets were written to
// (paths in the sandbox) from its disk at rootDir, never following a link
// out of it.
func removeSecretFiles(rootDir string, files map[string]string) error {
	if len(files) == 0 {
		return nil
	}
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return err
	}
	defer root.Close()
	for p := range files {
		if err := root.Remove(strings.TrimPrefix(p, "/")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing secret file %s: %w", p, err)
		}
	}
	return nil
}

// treeBytes is the size of the files under dir (0 when it is missing).
func treeBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
