// Package disk keeps sandboxes' root filesystems: read-only templates and,
// from them, one writable copy-on-write volume per sandbox, plus read-only
// snapshots of volumes that checkpoints keep and forks and restores clone.
//
// Terms: a template is a read-only root filesystem sandboxes start from; a
// volume is one sandbox's writable root; a snapshot is a read-only, frozen
// copy of a volume at one moment (crash-consistent: taken without pausing).
// What one volume's writer writes is never seen through another volume.
package disk

import (
	"context"
	"errors"
)

// Errors of a Pool, wrapped with context.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
)

// Pool is a place volumes live. Names (template names, volume ids, snapshot
// ids) are plain path-safe words chosen by the caller. Implementations are
// safe for concurrent use.
type Pool interface {
	// Kind names the implementation: "btrfs" or "copy".
	Kind() string
	// HasTemplate reports whether the template exists.
	HasTemplate(ctx context.Context, name string) (bool, error)
	// ImportTemplate makes template name from the directory tree at src,
	// copying it (owners, modes, links, devices kept). The template appears
	// whole or not at all.
	ImportTemplate(ctx context.Context, name, src string) error
	// TemplatePath is the path of a template's root (whether or not it
	// exists), for reading it.
	TemplatePath(name string) string
	// CreateVolume makes volume id as a writable copy of template and
	// returns the path of its root.
	CreateVolume(ctx context.Context, id, template string) (string, error)
	// VolumePath is the path of a volume's root (whether or not it exists).
	VolumePath(id string) string
	// DeleteVolume removes a volume; removing one that is gone is no error.
	DeleteVolume(ctx context.Context, id string) error
	// RenameVolume gives volume from the id to, which must not exist
	// (ErrExists), at once: no copy. A volume prepared under a temporary
	// id takes the place of one just deleted. The rename is not synced:
	// after a crash either name may hold it.
	RenameVolume(ctx context.Context, from, to string) error
	// Snapshot makes read-only snapshot snap of volume id, without pausing
	// its writers.
	Snapshot(ctx context.Context, id, snap string) error
	// SyncSnapshot makes snapshot snap, just made by Snapshot, durable:
	// once it returns, a power loss keeps the snapshot and all it holds.
	// It never flushes more than it must (other volumes' writes), since a
	// memory checkpoint waits for it.
	SyncSnapshot(ctx context.Context, snap string) error
	// CloneSnapshot makes volume id as a writable copy of snapshot snap and
	// returns its root.
	CloneSnapshot(ctx context.Context, snap, id string) (string, error)
	// ImportSnapshot makes read-only snapshot snap from the directory tree
	// at src, copying it (owners, modes, links, devices kept). The snapshot
	// appears whole or not at all.
	ImportSnapshot(ctx context.Context, snap, src string) error
	// SnapshotPath is the path of a snapshot's root (whether or not it
	// exists), for reading it.
	SnapshotPath(snap string) string
	// DeleteSnapshot removes a snapshot; removing one that is gone is no error.
	DeleteSnapshot(ctx context.Context, snap string) error
	// Snapshots lists every snapshot, for clean-up after a crash.
	Snapshots(ctx context.Context) ([]string, error)
	// Volumes lists every volume, for clean-up after a crash.
	Volumes(ctx context.Context) ([]string, error)
	// Usage is the space a volume takes that it does not share, in bytes
	// (an estimate where the filesystem cannot tell exactly).
	Usage(ctx context.Context, id string) (int64, error)
	// Close releases the pool; volumes stay on disk.
	Close() error
}
