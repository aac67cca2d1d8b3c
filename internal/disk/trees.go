package disk

import (
	"context"
	"fmt"
)

// trees is what the pool variants share: their named trees (templates,
// volumes, snapshots) in one layout, the names checked, the destinations
// locked, the errors worded and the listings made here, once. A variant
// embeds it and says, as its treeOps, how a tree is made, copied in,
// removed and measured: by btrfs subvolumes and snapshots (Btrfs) or by
// copies of plain directories (Copy). The variants' own docs say what
// their trees promise (a btrfs snapshot is of one instant, a copy is not).
type trees struct {
	l layout
	// locks serializes check-then-create per destination name (keys "t/",
	// "v/" and "s/" and the name).
	locks keyedLock
	ops   treeOps
}

// treeOps is what each pool variant does its own way.
type treeOps interface {
	// clone makes dst from the pool's tree src under the lock for key:
	// read-only for a snapshot, writable for a volume. It fails with
	// ErrNotFound when src is missing and ErrExists when dst is there.
	clone(ctx context.Context, src, key, dst string, readOnly bool) error
	// importTree makes dst a read-only copy of src, a directory outside
	// the pool (symlinks resolved), under the lock for key; what is
	// "template" or "snapshot", for the name of its work in tmp/.
	importTree(ctx context.Context, src, key, dst, what, name string) error
	// remove deletes the tree at path under the lock for key; one that is
	// gone is no error.
	remove(ctx context.Context, key, path string) error
	// usage is the space the volume at root takes.
	usage(ctx context.Context, root string) (int64, error)
}

// HasTemplate reports whether template name exists.
func (t *trees) HasTemplate(ctx context.Context, name string) (bool, error) {
	if err := validName(name); err != nil {
		return false, err
	}
	ok, err := exists(t.l.templatePath(name))
	if err != nil {
		return false, fmt.Errorf("checking template %s: %w", name, err)
	}
	return ok, nil
}

// ImportTemplate copies src to template name, which appears whole and
// durable or not at all.
func (t *trees) ImportTemplate(ctx context.Context, name, src string) error {
	return t.importAs(ctx, "template", "t/", name, src, t.l.templatePath(name))
}

// ImportSnapshot copies src to snapshot snap, which appears whole and
// durable or not at all.
func (t *trees) ImportSnapshot(ctx context.Context, snap, src string) error {
	return t.importAs(ctx, "snapshot", "s/", snap, src, t.l.snapshotPath(snap))
}

func (t *trees) importAs(ctx context.Context, what, prefix, name, src, dst string) error {
	if err := validName(name); err != nil {
		return err
	}
	src, err := resolveDir(src)
	if err == nil {
		err = t.ops.importTree(ctx, src, prefix+name, dst, what, name)
	}
	if err != nil {
		return fmt.Errorf("importing %s %s: %w", what, name, err)
	}
	return nil
}

// CreateVolume makes volume id from template.
func (t *trees) CreateVolume(ctx context.Context, id, template string) (string, error) {
	if err := validNames(id, template); err != nil {
		return "", err
	}
	if err := t.ops.clone(ctx, t.l.templatePath(template), "v/"+id, t.l.volumePath(id), false); err != nil {
		return "", fmt.Errorf("creating volume %s from template %s: %w", id, template, err)
	}
	return t.l.volumePath(id), nil
}

// CloneSnapshot makes volume id from snapshot snap.
func (t *trees) CloneSnapshot(ctx context.Context, snap, id string) (string, error) {
	if err := validNames(snap, id); err != nil {
		return "", err
	}
	if err := t.ops.clone(ctx, t.l.snapshotPath(snap), "v/"+id, t.l.volumePath(id), false); err != nil {
		return "", fmt.Errorf("cloning snapshot %s as volume %s: %w", snap, id, err)
	}
	return t.l.volumePath(id), nil
}

// Snapshot makes snapshot snap, read-only, from volume id.
func (t *trees) Snapshot(ctx context.Context, id, snap string) error {
	if err := validNames(id, snap); err != nil {
		return err
	}
	if err := t.ops.clone(ctx, t.l.volumePath(id), "s/"+snap, t.l.snapshotPath(snap), true); err != nil {
		return fmt.Errorf("snapshotting volume %s as %s: %w", id, snap, err)
	}
	return nil
}

// VolumePath is where volume id's root is.
func (t *trees) VolumePath(id string) string { return t.l.volumePath(id) }

// TemplatePath is where template name's root is.
func (t *trees) TemplatePath(name string) string { return t.l.templatePath(name) }

// SnapshotPath is where snapshot snap's root is.
func (t *trees) SnapshotPath(snap string) string { return t.l.snapshotPath(snap) }

// RenameVolume renames volume from to to.
func (t *trees) RenameVolume(ctx context.Context, from, to string) error {
	return t.l.renameVolume(ctx, &t.locks, from, to)
}

// DeleteVolume deletes volume id; its snapshots stay.
func (t *trees) DeleteVolume(ctx context.Context, id string) error {
	return t.deleteAs(ctx, "volume", "v/", id, t.l.volumePath(id))
}

// DeleteSnapshot deletes snapshot snap; volumes cloned from it stay.
func (t *trees) DeleteSnapshot(ctx context.Context, snap string) error {
	return t.deleteAs(ctx, "snapshot", "s/", snap, t.l.snapshotPath(snap))
}

// DeleteTemplate deletes template name (an image's, once no sandbox is
// made from it); deleting one that is gone is no error. Volumes and
// snapshots made from it keep their data.
func (t *trees) DeleteTemplate(ctx context.Context, name string) error {
	return t.deleteAs(ctx, "template", "t/", name, t.l.templatePath(name))
}

func (t *trees) deleteAs(ctx context.Context, what, prefix, name, path string) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := t.ops.remove(ctx, prefix+name, path); err != nil {
		return fmt.Errorf("deleting %s %s: %w", what, name, err)
	}
	return nil
}

// Snapshots lists the snapshots, sorted.
func (t *trees) Snapshots(ctx context.Context) ([]string, error) { return t.l.list(snapshotsDir) }

// Volumes lists the volumes, sorted.
func (t *trees) Volumes(ctx context.Context) ([]string, error) { return t.l.list(volumesDir) }

// Templates lists the pool's templates by name.
func (t *trees) Templates(ctx context.Context) ([]string, error) { return t.l.list(templatesDir) }

// Usage is the space volume id takes (see each variant's usage).
func (t *trees) Usage(ctx context.Context, id string) (int64, error) {
	if err := validName(id); err != nil {
		return 0, err
	}
	root := t.l.volumePath(id)
	err := mustExist(root)
	var n int64
	if err == nil {
		n, err = t.ops.usage(ctx, root)
	}
	if err != nil {
		return 0, fmt.Errorf("measuring volume %s: %w", id, err)
	}
	return n, nil
}
