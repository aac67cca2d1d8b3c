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
}

// CreateCheckpoint is the body of POST /v1/sandboxes/{sandbox}/checkpoints.
// Memory defaults to true when left out.
type CreateCheckpoint struct {
	Comment string `json:"comment,omitempty"`
	Memory  *bool  `json:"memory,omitempty"`
	Name    string `json:"name,omitempty"`
}

// CheckpointList is the body of GET /v1/sandboxes/{sandbox}/checkpoints,
// oldest first.
type CheckpointList struct {
	Checkpoints []Checkpoint `json:"checkpoints"`
}
