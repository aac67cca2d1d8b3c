// Package crash holds the daemon's named crash points: places between two
// durable steps of an operation (a store write, a disk snapshot, a runsc
// call, a rename) where a test can make the process die, as a crash or a
// power cut would, to check that recovery at the next start leaves every
// sandbox as it was before the operation or as after it, never between.
//
// Point is an empty function unless the binary is built with the build tag
// crashpoints (point_on.go): a release build carries neither the points'
// names nor the variable that arms them. Every name passed to Point is one
// of Points, and every one of Points is passed to Point exactly once
// (crash_test.go checks both by reading the source).
package crash

// Points lists every crash point, grouped by the operation that passes it
// first. Shared steps (boot, prepare, resume, destroy, the template cache)
// are named once, by the step.
var Points = []string{
	// Create: the record, then the disk, the network, the container.
	"create.stored",
	"boot.disk",
	"prepare.netns",
	"prepare.policy",
	"boot.started",
	"boot.connected",
	"create.services",

	// Memory and disk-only checkpoints.
	"checkpoint.numbered",
	"checkpoint.image",
	"checkpoint.snapshot",
	"checkpoint.frozen",
	"token.stored",
	"checkpoint.synced",
	"checkpoint.renamed",
	"checkpoint.disk-snapshot",
	"checkpoint.asleep",
	"checkpoint-delete.record",

	// Restore in place: the automatic checkpoint, then the roll back.
	"restore.numbered",
	"restore.auto-image",
	"restore.auto-gen",
	"restore.auto-kept",
	"restore.restoring",
	"rollback.stopped",
	"rollback.disk-dropped",
	"rollback.disk-back",
	"resume.restored",
	"resume.connected",

	// Fork.
	"fork.stored",
	"fork.disk",

	// Sleep and wake.
	"sleep.image",
	"sleep.durable",
	"sleep.deleted",
	"wake.numbered",
	"wake.restored",
	"wake.connected",
	"wake.image-dropped",

	// Delete.
	"delete.marked",
	"destroy.container",
	"destroy.network",
	"destroy.disk",
	"destroy.checkpoints",
	"destroy.dirs",

	// Image pull, and the template cache it builds into.
	"image.recorded",
	"image.described",
	"cache.built",
	"cache.imported",
	"image-delete.record",

	// Checkpoint templates: made, deleted, imported, and sandboxes made from one.
	"template.volume",
	"template.filled",
	"template.synced",
	"template-delete.renamed",
	"template-import.unpacked",
	"template-sandbox.stored",
	"template-sandbox.disk",

	// Warm pool claim, network policy change.
	"pool.claimed",
	"network.stored",

	// Recovery's own steps: a sandbox that a cut sleep or restore left
	// stopped, restarted from the image it wrote, not yet connected.
	"recover.resumed",
}
