package api

import "time"

// Checkpoint is a checkpoint as the API shows it. A memory checkpoint holds
// the sandbox's memory and disk (restoring it resumes its processes); a
// disk-only one holds the disk (restoring it boots fresh on that disk).
type Checkpoint struct {
	// ID is v1, v2, … for checkpoints taken on request (never reused) and
	// auto-1, auto-2, … for the automatic ones kept before a restore.
	ID string `json:"id"`
	// Sandbox is the id of the sandbox the checkpoint belongs to.
	Sandbox string `json:"sandbox"`
	Name    string `json:"name,omitempty"`
	Comment string `json:"comment"`
	Memory  bool   `json:"memory"`
	Auto    bool   `json:"auto"`
	// Inside is true for a checkpoint the sandbox took of itself through
	// its in-sandbox API, or, for an automatic one, kept by a restore the
	// sandbox asked for. Those count against a share of their own, apart
	// from the owner's (see the daemon's --inside-checkpoint-limit), and
	// are the only ones the sandbox may delete.
	Inside    bool      `json:"inside"`
	CreatedAt time.Time `json:"created_at"`
	// Storage says where its data is, on a daemon with an object store
	// (loam serve --objects); absent on one without.
	Storage *CheckpointStorage `json:"storage,omitempty"`
}

// CheckpointStorage says where a checkpoint's data is, and how its upload
// to the object store goes.
type CheckpointStorage struct {
	// State is StorageLocal (on its node's disk alone: being uploaded, or
	// about to be) or StorageStored (in the object store too, with a
	// manifest written last: it outlives its node).
	State string `json:"state"`
	// UploadedBytes and TotalBytes are the upload's progress while it
	// runs.
	UploadedBytes int64 `json:"uploaded_bytes,omitempty"`
	TotalBytes    int64 `json:"total_bytes,omitempty"`
	// Error is why the last try of its upload failed; it is tried again.
	Error string `json:"error,omitempty"`
}

// CheckpointStorage's states.
const (
	StorageLocal  = "local"
	StorageStored = "stored"
)

// CreateCheckpoint is the body of POST /v1/sandboxes/{sandbox}/checkpoints.
// Memory defaults to true when left out.
type CreateCheckpoint struct {
	Comment string `json:"comment,omitempty"`
	Memory  *bool  `json:"memory,omitempty"`
	Name    string `json:"name,omitempty"`
	// Wait, WaitStored, answers once the checkpoint is stored off the
	// node (a daemon with an object store); "" answers once it is taken.
	Wait string `json:"wait,omitempty"`
}

// WaitStored is CreateCheckpoint.Wait (and GET …/checkpoints/{cp}?wait=)
// for an answer once the checkpoint is in the object store.
const WaitStored = "stored"

// CheckpointList is the body of GET /v1/sandboxes/{sandbox}/checkpoints,
// oldest first.
type CheckpointList struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
}
