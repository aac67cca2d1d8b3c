// Package runtime defines how loam drives an isolation runtime. The gVisor
// driver (runtime/gvisor) is the real one; tests of the state machine may use
// a fake.
//
// Terms: a container is one sandbox's runtime instance, named by the
// sandbox's id. Its init process is loam's agent. A memory image is the
// directory a checkpoint writes: the sandbox's memory and kernel state, not
// its disk (the disk is a volume, kept by package disk).
package runtime

import (
	"context"
	"errors"
)

// Errors of a Runtime, wrapped with context.
var (
	// ErrNotExist is returned when the runtime has no container by that id.
	ErrNotExist = errors.New("container does not exist")
	// ErrExist is returned by Start and Restore when the id is taken.
	ErrExist = errors.New("container already exists")
)

// Status is a container's state as the runtime sees it.
type Status string

// Container states.
const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped" // created or exited; only delete is left to do
)

// Spec is everything the runtime needs to start (or restore) one container.
type Spec struct {
	// ID names the container: the sandbox id (fixed length, so that
	// runsc's prefix matching of ids never finds two).
	ID string
	// BundleDir is a directory the driver owns for this container (config,
	// logs). It is kept across restarts of the daemon.
	BundleDir string
	// Rootfs is the container's root filesystem, writable, mounted as /.
	Rootfs string
	// Netns is the path of the network namespace to run in
	// (/var/run/netns/NAME). Its interfaces must be configured before Start
	// and before Restore.
	Netns string
	// Hostname inside the sandbox.
	Hostname string
	// AgentBinary is the static loam binary on the host; it is mounted
	// read-only at AgentPath and run as init with AgentArgs.
	AgentBinary string
	// Env is init's environment, KEY=VALUE.
	Env []string
	// CPUs is the CPU quota in cores; 0 means no limit.
	CPUs float64
	// MemoryMiB is the memory limit; 0 means no limit.
	MemoryMiB int
	// DiskQuota is the directory of the live counters of Rootfs's disk
	// quota (disk.Limiter's QuotaDir), or "" for none. The sandbox's
	// statfs of / then shows the quota's limit as the disk's size and
	// what is left of it as its free space, where the runtime can.
	DiskQuota string
	// CPUFeatures, when set, are the CPU features the sandbox may see, at
	// most (gVisor's names, as `runsc cpu-features` prints a host's):
	// a cluster pins them to what every node has, so that a memory image
	// taken on one node restores on any. Empty is all the host has.
	CPUFeatures []string
	// Background makes Restore return before the memory image is loaded
	// (runsc restore -background): the container runs while its pages
	// stream in, a page touched first being read first. Start ignores
	// it. The image must stay readable until the load ends; one whose
	// files are removed meanwhile is still read through the open files.
	Background bool
}

// Limits are a container's resource limits, with the meaning of the Spec
// fields of the same names.
type Limits struct {
	// CPUs is the CPU quota in cores; 0 means no limit.
	CPUs float64
	// MemoryMiB is the memory limit; 0 means no limit.
	MemoryMiB int
}

// Limits returns the limits spec gives its container.
func (s Spec) Limits() Limits { return Limits{CPUs: s.CPUs, MemoryMiB: s.MemoryMiB} }

// AgentPath is where the agent binary appears inside every sandbox.
const AgentPath = "/.loam/loam"

// AgentArgs are init's arguments.
var AgentArgs = []string{AgentPath, "agent"}

// CheckpointOptions tune Checkpoint.
type CheckpointOptions struct {
	// LeaveRunning keeps the container running after the image is written;
	// otherwise it is stopped, and only Delete is left to do (runsc goes on
	// reporting it as running for about 2 s while its sandbox exits).
	LeaveRunning bool
	// Flushed, if set, is called once the container's filesystem is as
	// the image has it and stays so (the container paused, or stopped):
	// loam snapshots the disk there. A runtime that can tell that point
	// calls it while the memory is still being written, others once the
	// image is; either way Checkpoint returns after both, with Flushed's
	// error among its own. It is not called when the save fails before.
	Flushed func() error
}

// Runtime starts, stops and checkpoints containers. Implementations are safe
// for concurrent use on different ids; the caller serialises calls on one id.
type Runtime interface {
	// Start creates and starts a container from spec, detached: it keeps
	// running when the caller (or the daemon) exits.
	Start(ctx context.Context, spec Spec) error
	// State reports the container's status, or ErrNotExist.
	State(ctx context.Context, id string) (Status, error)
	// Delete stops the container if it runs and removes it. Deleting a
	// container that does not exist is not an error.
	Delete(ctx context.Context, id string) error
	// Pause freezes every process of the container; Resume thaws them.
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Checkpoint writes the container's memory image into imageDir, which
	// must not exist yet and is created by the call.
	Checkpoint(ctx context.Context, id, imageDir string, opts CheckpointOptions) error
	// Restore starts a new container from spec with the memory image in
	// imageDir, detached. The id must not exist. Restoring into an id other
	// than the checkpointed one is a fork.
	Restore(ctx context.Context, spec Spec, imageDir string) error
	// SetLimits makes a running or paused container's limits l, whatever
	// they are now: a limit of 0 is removed, as in Spec. It is idempotent,
	// and it is how the caller puts back limits that a crash or a failed
	// call may have left lifted (Checkpoint and Restore lift the CPU quota
	// while they run). ErrNotExist when there is no such container.
	SetLimits(ctx context.Context, id string, l Limits) error
}

// HeldCheckpointer is an optional ability of a Runtime, found by a type
// check: a memory checkpoint of a running container that keeps it paused
// while the caller does its own work on it, in one step of the runtime's.
// The caller's work (whilePaused: loam snapshots the disk) then sees the
// container exactly as its memory image does, and the pause holds only the
// save and that work, not the runtime's own start-up costs of a separate
// pause and resume.
type HeldCheckpointer interface {
	// CheckpointHeld pauses container id, writes its memory image into
	// imageDir (which must not exist yet), calls whilePaused with the
	// container still paused, and resumes it once both are done, whatever
	// whilePaused returns. whilePaused runs once the container's
	// filesystem is as the image has it: a runtime that knows that point
	// calls it while the memory is still being written, others once it
	// is. It is not called when the save fails before that point. On
	// error imageDir is removed and the container is left running when
	// it can be; one left paused is an error.
	CheckpointHeld(ctx context.Context, id, imageDir string, whilePaused func() error) error
}
