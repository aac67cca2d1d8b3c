package api

import "time"

// NodeState is whether a node of a cluster answers (loam serve --node).
type NodeState string

// A node is ready while it renews its lease in the database, unreachable
// once the lease has run out: its sandboxes' records stay, but nothing
// acts on them until it is back.
const (
	NodeReady       NodeState = "ready"
	NodeUnreachable NodeState = "unreachable"
)

// Node is a node of a cluster, as GET /v1/nodes shows it (operator only).
type Node struct {
	Name    string    `json:"name"`
	Address string    `json:"address"`
	State   NodeState `json:"state"`
	// Cordoned is true while the node takes no new sandboxes (loam nodes
	// cordon); the ones it has run on.
	Cordoned bool `json:"cordoned"`
	NodeLoad
	JoinedAt time.Time `json:"joined_at"`
	// RenewedAt is when the node last renewed its lease, LeaseUntil when
	// the lease runs out unless it renews again.
	RenewedAt  time.Time `json:"renewed_at"`
	LeaseUntil time.Time `json:"lease_until"`
}

// NodeLoad is what a node reports of itself with every renewal of its
// lease: what it runs, what it has, and what is free.
type NodeLoad struct {
	// Role is "node" (runs sandboxes) or "api" (a front end with none).
	Role string `json:"role"`
	// Runsc is the build of gVisor's runsc the node runs sandboxes with.
	Runsc string `json:"runsc,omitempty"`
	// CPUFeatures are the host CPU's features sandboxes see (a memory
	// checkpoint restores only where they are all present).
	CPUFeatures   []string `json:"cpu_features,omitempty"`
	CPUs          int      `json:"cpus"`
	MemoryMiB     int64    `json:"memory_mib"`
	MemoryFreeMiB int64    `json:"memory_free_mib"`
	DiskMiB       int64    `json:"disk_mib"`
	DiskFreeMiB   int64    `json:"disk_free_mib"`
	// Sandboxes is how many sandboxes the node owns, Running how many of
	// them run now.
	Sandboxes int `json:"sandboxes"`
	Running   int `json:"running"`
	// Templates and Images are what the node has cached, by name and by
	// digest: a sandbox made of them starts there without a copy.
	Templates []string `json:"templates,omitempty"`
	Images    []string `json:"images,omitempty"`
	// CheckpointTemplates are the checkpoint templates the node keeps, as
	// "org/name": until templates travel, a sandbox of one is made on the
	// node that keeps it, and nowhere else.
	CheckpointTemplates []string `json:"checkpoint_templates,omitempty"`
}

// NodeList is the answer of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// NodeRemovedReason is the reason of the sandboxes of a node removed for
// good (state error): their records are all that is left of them.
const NodeRemovedReason = "node removed"

// NodeRemoved is the answer of DELETE /v1/nodes/{node}?force=true: the
// node is gone for good, and Sandboxes of its sandboxes are now in state
// error ("node removed").
type NodeRemoved struct {
	Node      string `json:"node"`
	Sandboxes int    `json:"sandboxes"`
}

// MoveSandbox is the body of POST /v1/sandboxes/{sandbox}/move (the
// operator's): the node to move the sandbox to, or "" for the one
// placement picks.
type MoveSandbox struct {
	To string `json:"to,omitempty"`
}

// DrainResult is the answer of POST /v1/nodes/{node}/drain: the node,
// cordoned, and each of its sandboxes moved off it, or why not.
type DrainResult struct {
	Node   string         `json:"node"`
	Moved  []MovedSandbox `json:"moved"`
	Failed []MoveFailure  `json:"failed"`
}

// MovedSandbox is a sandbox a drain moved: to which node ("" for a
// sleeping one, which just lost its tie to the node: it wakes on the node
// of the first call that needs it running), and how long its move took
// (ms).
type MovedSandbox struct {
	Name string `json:"name"`
	ID   string `json:"id"`
	To   string `json:"to"`
	MS   int64  `json:"ms"`
}

// MoveFailure is a sandbox a drain could not move, and why; it is where
// it was (running again there when its move got that far).
type MoveFailure struct {
	Name  string `json:"name"`
	ID    string `json:"id"`
	Error *Error `json:"error"`
}
