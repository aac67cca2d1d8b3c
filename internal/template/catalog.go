package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/crash"
	"loam.dev/loam/internal/store"
)

// Core is what the catalog needs of the sandbox core (sandbox.TemplateCore has
// it) to make a template of a checkpoint.
type Core interface {
	// Heavy takes a slot among the daemon's heavy operations for what
	// (api.CodeLimit when none comes free in time); leave gives it back.
	Heavy(ctx context.Context, what string) (leave func(), err error)
	// HoldCheckpoint finds checkpoint from and holds it, and its sandbox,
	// until release is called.
	HoldCheckpoint(ctx context.Context, from *api.ForkSource) (src *checkpoint.Source, release func(), err error)
	// CheckResources refuses resources no sandbox may have (an imported
	// template's).
	CheckResources(r api.Resources) error
	// AdmitTemplate holds a template of org that will hold bytes to the
	// org's disk quota (api.CodeLimit when it does not fit) until release,
	// which is called once the template is published or failed.
	AdmitTemplate(ctx context.Context, org string, bytes int64) (release func(), err error)
}

// Pools are the warm pools of templates (warmpool.Pools has them).
type Pools interface {
	// SetTemplatePool sets the size of template name's pool.
	SetTemplatePool(ctx context.Context, name string, size int) (*api.Pool, error)
	// DropTemplatePools drains and removes org's pool of template name.
	DropTemplatePools(ctx context.Context, org, name string)
}

// Images lists the images the daemon pulled, or is pulling (image.Service
// has it).
type Images interface {
	List(ctx context.Context) ([]api.Image, error)
}

// Sandboxes lists the sandboxes (the metadata store has it): a template's
// uses.
type Sandboxes interface {
	ListSandboxes(ctx context.Context, f store.Filter) ([]*store.Sandbox, error)
}

// Cluster is the catalog's view of the cluster its node is one of
// (cluster.Member has it): until templates travel, each checkpoint
// template is on the node that made it alone.
type Cluster interface {
	// Name is this node's name.
	Name() string
	// HeldElsewhere are the checkpoint templates of org the other nodes
	// keep, by name, and the node of each, as their leases last said.
	HeldElsewhere(org string) map[string]string
	// Report renews this node's lease at once, so that the other nodes
	// learn of a template made or deleted here before they place a
	// sandbox of it.
	Report(ctx context.Context)
}

// Config is what a Catalog is made over.
type Config struct {
	Store     *Store
	Core      Core
	Pools     Pools
	Sandboxes Sandboxes
	// Images are listed as templates; nil lists none.
	Images Images
	// Cluster, on a node of a cluster, lists the other nodes' checkpoint
	// templates too; nil on a daemon alone.
	Cluster Cluster
	Log     *slog.Logger
}

// Catalog is the templates as the API serves them (GET, POST, DELETE
// /v1/templates, export and import): every kind, with their uses.
type Catalog struct {
	store     *Store
	core      Core
	pools     Pools
	sandboxes Sandboxes
	images    Images
	cluster   Cluster
	log       *slog.Logger
}

// New makes a Catalog.
func New(cfg Config) *Catalog {
	return &Catalog{store: cfg.Store, core: cfg.Core, pools: cfg.Pools, sandboxes: cfg.Sandboxes, images: cfg.Images, cluster: cfg.Cluster, log: cfg.Log}
}

// List lists the templates sandboxes can be made from, kind by kind
// (Kinds), each with how many sandboxes use it.
func (c *Catalog) List(ctx context.Context) []api.Template {
	// One listing counts the uses of every kind: a sandbox of an image is
	// counted under its image. A warm pool's members are no uses. The
	// caller sees its own org's uses, never another's.
	uses, imageUses := map[string]int{}, map[string]int{}
	if sbs, err := c.sandboxes.ListSandboxes(ctx, store.Filter{Org: auth.Scope(ctx)}); err == nil {
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
		c.log.Warn("counting the sandboxes of templates", "err", err)
	}
	var out []api.Template
	for _, kind := range Kinds {
		switch kind {
		case api.TemplateBuiltin:
			for _, t := range c.store.Builtins(ctx) {
				t.Uses = uses[t.Name]
				out = append(out, t)
			}
		case api.TemplateCheckpoint:
			org := c.store.orgOf(ctx)
			kept, err := c.store.list(org)
			if err != nil {
				c.log.Warn("listing checkpoint templates", "err", err)
			}
			for _, man := range kept {
				out = append(out, c.node(keptView(man, uses[man.Name])))
			}
			out = append(out, c.elsewhere(org, kept, uses)...)
		case api.TemplateImage:
			out = append(out, c.imageTemplates(ctx, imageUses)...)
		}
	}
	return out
}

// node is t, kept on this node, with its node named on a node of a
// cluster.
func (c *Catalog) node(t api.Template) api.Template {
	if c.cluster != nil {
		t.Node = c.cluster.Name()
	}
	return t
}

// elsewhere are org's checkpoint templates other nodes of the cluster
// keep (but this one, which has kept), by name and node: their details
// are on their node.
func (c *Catalog) elsewhere(org string, kept []*checkpoint.Manifest, uses map[string]int) []api.Template {
	if c.cluster == nil {
		return nil
	}
	held := c.cluster.HeldElsewhere(org)
	for _, man := range kept {
		delete(held, man.Name)
	}
	var out []api.Template
	for _, name := range slices.Sorted(maps.Keys(held)) {
		out = append(out, api.Template{
			Name: name, Description: "a checkpoint template kept on node " + held[name], Ready: true,
			Kind: api.TemplateCheckpoint, State: api.TemplateReady, Progress: 100, Uses: uses[name], Node: held[name],
		})
	}
	return out
}

// imageTemplates are the images the daemon pulled, or is pulling, as
// templates: named by their ref, as a create gives it in "image"; uses
// counts the sandboxes of each.
func (c *Catalog) imageTemplates(ctx context.Context, uses map[string]int) []api.Template {
	if c.images == nil {
		return nil
	}
	images, err := c.images.List(ctx)
	if err != nil {
		c.log.Warn("listing images", "err", err)
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

func keptView(man *checkpoint.Manifest, uses int) api.Template {
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

// Create keeps a checkpoint as template req.Name: a copy-on-write copy of
// its disk snapshot and hard links to its memory image (which is never
// written again), so deleting the checkpoint or its sandbox leaves the
// template whole.
func (c *Catalog) Create(ctx context.Context, req api.CreateTemplate) (*api.Template, error) {
	leave, err := c.core.Heavy(ctx, "making a template")
	if err != nil {
		return nil, err
	}
	defer leave()
	if err := CheckName(req.Name); err != nil {
		return nil, err
	}
	if err := api.CheckPoolSize(req.Pool); err != nil {
		return nil, err
	}
	org := c.store.orgOf(ctx)
	src, release, err := c.core.HoldCheckpoint(ctx, req.From)
	if err != nil {
		return nil, err
	}
	defer release()
	cp := src.Checkpoint
	// Admitted by what it will hold, as its manifest counts it once
	// published: the checkpoint's disk as it is, and its memory image.
	size := checkpoint.TreeBytes(c.store.disks.SnapshotPath(src.Snapshot))
	if cp.Memory {
		size += checkpoint.TreeBytes(src.MemDir)
	}
	admitted, err := c.core.AdmitTemplate(ctx, org, size)
	if err != nil {
		return nil, err
	}
	defer admitted()
	ctx = context.WithoutCancel(ctx)
	man := checkpoint.Manifest{
		Format: checkpoint.ManifestFormat, Name: req.Name, Memory: cp.Memory,
		Template: cp.Template, Image: cp.Image, Resources: cp.Resources,
		From: src.Sandbox + "/" + cp.ID, CreatedAt: store.Now(),
	}
	if cp.Memory {
		man.AgentToken = src.AgentToken
	}
	disks := c.store.disks
	err = c.store.publish(ctx, org, &man, func(tmp, snap string) error {
		// A writable clone of the checkpoint's disk, frozen again as the
		// template's own snapshot: on btrfs both are instant.
		vol := "tplcopy-" + randomHex(6)
		root, err := disks.CloneSnapshot(ctx, src.Snapshot, vol)
		if err != nil {
			return fmt.Errorf("copying the disk: %w", err)
		}
		crash.Point("template.volume")
		// The source's secrets given as files are its own, not the
		// template's: a sandbox of the template gets those it is given.
		err = removeSecretFiles(root, src.SecretFiles)
		if err == nil {
			err = disks.Snapshot(ctx, vol, snap)
		}
		if derr := disks.DeleteVolume(ctx, vol); err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("copying the disk: %w", err)
		}
		if cp.Memory {
			if err := checkpoint.LinkTree(src.MemDir, filepath.Join(tmp, memDir)); err != nil {
				return fmt.Errorf("keeping the memory image: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.log.Info("template made", "template", man.Name, "org", org, "from", man.From, "memory", man.Memory)
	c.report(ctx)
	if req.Pool > 0 {
		if _, err := c.pools.SetTemplatePool(ctx, man.Name, req.Pool); err != nil {
			c.log.Error("keeping the new template's pool", "template", man.Name, "err", err)
		}
	}
	v := c.node(keptView(&man, 0))
	return &v, nil
}

// report tells the cluster at once that this node's templates changed.
func (c *Catalog) report(ctx context.Context) {
	if c.cluster != nil {
		c.cluster.Report(ctx)
	}
}

// Delete deletes the caller's org's checkpoint template name, unless a
// sandbox of the org uses it.
func (c *Catalog) Delete(ctx context.Context, name string) error {
	if c.store.Builtin(name) {
		return api.Errorf(api.CodeForbidden, "template %s is built in and cannot be deleted", name)
	}
	s := c.store
	org := s.orgOf(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	man, err := s.Kept(org, name)
	if err != nil {
		return err
	}
	if man == nil {
		return api.Errorf(api.CodeNotFound, "template %q not found", name)
	}
	sbs, err := c.sandboxes.ListSandboxes(ctx, store.UsersOf(org, s.org))
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
	s.exportMu.Lock()
	exports := s.exporting[exportKey(man.Org, name)]
	s.exportMu.Unlock()
	if exports > 0 {
		return api.Errorf(api.CodeConflict, "template %s is being exported; try again when the export ends", name)
	}
	c.pools.DropTemplatePools(ctx, org, name)
	// Gone at once by a rename; the data goes after (or at the next start).
	dir := s.dirOf(org)
	gone := filepath.Join(dir, ".del-"+name+"-"+randomHex(6))
	if err := os.Rename(filepath.Join(dir, name), gone); err != nil {
		return fmt.Errorf("deleting template %s: %w", name, err)
	}
	crash.Point("template-delete.renamed")
	ctx = context.WithoutCancel(ctx)
	if err := errors.Join(s.disks.DeleteSnapshot(ctx, man.Snapshot), os.RemoveAll(gone)); err != nil {
		c.log.Warn("removing template data", "template", name, "err", err)
	}
	c.log.Info("template deleted", "template", name)
	c.report(ctx)
	return nil
}

// Export writes checkpoint template name to w as one archive (see
// checkpoint.WriteArchive). The template cannot be deleted meanwhile.
func (c *Catalog) Export(ctx context.Context, name string, w io.Writer) error {
	man, done, err := c.store.exportStart(c.store.orgOf(ctx), name)
	defer done()
	if err != nil {
		return err
	}
	if man == nil {
		if c.store.Builtin(name) {
			return api.Errorf(api.CodeInvalid, "template %s is built in: every loam builds it; only checkpoint templates are exported", name)
		}
		return api.Errorf(api.CodeNotFound, "template %q not found", name)
	}
	mem := ""
	if man.Memory {
		mem = c.store.MemDir(man.Org, name)
	}
	if err := checkpoint.WriteArchive(ctx, w, *man, c.store.disks.SnapshotPath(man.Snapshot), mem); err != nil {
		return fmt.Errorf("exporting template %s: %w", name, err)
	}
	return nil
}

// importReserve is the space an import leaves free on the data dir's disk.
const importReserve = 1 << 30

// Import makes checkpoint template name from an archive written by Export
// (on this host or another). The archive is unpacked into a temporary
// directory and checked whole before anything is published: a damaged or
// hostile one is refused (invalid) and leaves nothing.
func (c *Catalog) Import(ctx context.Context, name string, r io.Reader) (*api.Template, error) {
	leave, err := c.core.Heavy(ctx, "importing a template")
	if err != nil {
		return nil, err
	}
	defer leave()
	if err := CheckName(name); err != nil {
		return nil, err
	}
	s := c.store
	org := s.orgOf(ctx)
	if err := s.checkFree(org, name); err != nil {
		return nil, err
	}
	dir, err := s.makeDirOf(org)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(dir, ".tmp-import-"+name+"-")
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
	if err := c.core.CheckResources(man.Resources); err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) {
			return nil, err
		}
		return nil, api.Errorf(api.CodeInvalid, "template archive refused: manifest: %s", ae.Message)
	}
	if man.Memory && man.AgentToken == "" {
		return nil, api.Errorf(api.CodeInvalid, "template archive refused: a memory template without its agent token")
	}
	man.Name = name
	admitted, err := c.core.AdmitTemplate(ctx, org, checkpoint.TreeBytes(work))
	if err != nil {
		return nil, err
	}
	defer admitted()
	crash.Point("template-import.unpacked")
	ctx = context.WithoutCancel(ctx)
	err = s.publish(ctx, org, man, func(tmp, snap string) error {
		if err := s.disks.ImportSnapshot(ctx, snap, filepath.Join(work, checkpoint.DiskEntry)); err != nil {
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
	c.log.Info("template imported", "template", name, "memory", man.Memory, "bytes", man.SizeBytes)
	c.report(ctx)
	v := c.node(keptView(man, 0))
	return &v, nil
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
