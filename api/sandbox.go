package api

import "time"

// State is where a sandbox is in its life. The strings never change.
type State string

// The states of a sandbox.
const (
	StateCreating State = "creating" // disk and network being made, not yet booted
	StateRunning  State = "running"  // booted; its agent answers
	StateSleeping State = "sleeping" // memory saved to disk, no processes on the host
	StateStopped  State = "stopped"  // not running; its disk is kept
	StateError    State = "error"    // broken; Sandbox.Reason says why
	StateDeleting State = "deleting" // being freed
	// StateRestoring: being put back to a checkpoint; its processes and
	// disk are being replaced.
	StateRestoring State = "restoring"
	// StateUnknown: the sandbox's node (in a cluster) stopped answering;
	// Reason says which node and since when. It is shown, never stored:
	// the state the node last recorded returns when the node does.
	StateUnknown State = "unknown"
)

// Resources are the limits a sandbox runs under.
type Resources struct {
	// CPUs is the CPU quota, in cores (0.5 is half a core).
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryMiB is the memory limit in MiB.
	MemoryMiB int `json:"memory_mib,omitempty"`
	// DiskMiB is how much the sandbox may write to its disk, in MiB (see
	// DiskUse).
	DiskMiB int `json:"disk_mib,omitempty"`
}

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	State State  `json:"state"`
	// Reason says why a sandbox is in state error (its sandbox process
	// died, a restore failed, …) or unknown (its node stopped answering)
	// and what brings it back; for a running sandbox brought back on
	// another node from a stored checkpoint, that it was and what was
	// lost (until its next change of state); empty otherwise.
	Reason    string            `json:"reason,omitempty"`
	Template  string            `json:"template,omitempty"`
	Image     string            `json:"image,omitempty"`
	Resources Resources         `json:"resources"`
	Env       map[string]string `json:"env"`
	Labels    map[string]string `json:"labels"`
	// Idle is how long the sandbox may go without activity before it
	// sleeps, as given at create ("10m"; "0" never); empty takes the
	// daemon's default (loam serve --idle).
	Idle     string `json:"idle,omitempty"`
	HTTPPort int    `json:"http_port,omitempty"`
	URL      string `json:"url"`
	// Secrets and SecretFiles say which secrets the sandbox has, by name
	// (see CreateSandbox); never their values.
	Secrets     map[string]string `json:"secrets,omitempty"`
	SecretFiles map[string]string `json:"secret_files,omitempty"`
	// Public is true when the URL is open to anyone who reaches the daemon;
	// false (the default) asks for the API token or the sandbox's access
	// token (GET /v1/sandboxes/{sandbox}/access-token).
	Public bool `json:"public"`
	// Network is the sandbox's network policy.
	Network NetworkPolicy `json:"network"`
	// From is the checkpoint a fork was made from; empty for other sandboxes.
	From *ForkSource `json:"from,omitempty"`
	// Disk is how much of its disk the sandbox uses, read without waking
	// it; in GET and the list of sandboxes only.
	Disk *DiskUse `json:"disk,omitempty"`
	// Usage is the CPU and memory a running sandbox uses, read from its
	// cgroup; in GET and the list of sandboxes only, for running ones.
	Usage *Usage `json:"usage,omitempty"`
	// Node is the name of the node that owns the sandbox (loam serve
	// --node), the only one that acts on it; absent on one machine.
	Node string `json:"node,omitempty"`
	// Recover is what brings the sandbox back when its node is lost (in a
	// cluster with an object store): "latest-checkpoint" restores it on
	// another node from its latest stored checkpoint, losing what it did
	// after it (its reason says so); absent, it waits for its node.
	Recover   string    `json:"recover,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Usage is what a running sandbox uses of the host now.
type Usage struct {
	// MemoryBytes is the host memory its cgroup holds (the sandbox's
	// memory, gVisor's own and page cache included), against
	// resources.memory_mib.
	MemoryBytes int64 `json:"memory_bytes"`
	// CPUSeconds is the CPU time it used since its container started (a
	// restore, a fork or a wake starts one): two readings a known time
	// apart give its CPU use in cores.
	CPUSeconds float64 `json:"cpu_seconds"`
}

// DiskUse is a sandbox's use of its disk against resources.disk_mib.
type DiskUse struct {
	// UsedBytes is what the sandbox has written since its disk was made
	// (created, restored or forked), data that it deleted but one of its
	// checkpoints still holds included; what it shares with its template
	// or the checkpoint it came from is not counted. The counter lags
	// writes by up to 30 s (the filesystem's commit interval). Absent where
	// the daemon's disk pool keeps no counters.
	UsedBytes *int64 `json:"used_bytes,omitempty"`
	// LimitMiB is the limit, resources.disk_mib.
	LimitMiB int `json:"limit_mib"`
	// Enforced is true when a write beyond the limit fails inside the
	// sandbox (ENOSPC, "No space left on device"); false where the disk pool
	// cannot limit a sandbox (the plain-copy fallback, btrfs without
	// quotas).
	Enforced bool `json:"enforced"`
}

// ForkSource names the checkpoint a fork is made from: the source sandbox
// (name or id) and the checkpoint (id or name).
type ForkSource struct {
	Sandbox    string `json:"sandbox"`
	Checkpoint string `json:"checkpoint"`
}

// CreateSandbox is the body of POST /v1/sandboxes. Every field is optional.
// With From set it makes a fork: Template, Image and Resources then come from
// the checkpoint and may not be given.
type CreateSandbox struct {
	Name      string            `json:"name,omitempty"`
	Template  string            `json:"template,omitempty"`
	Image     string            `json:"image,omitempty"`
	Resources *Resources        `json:"resources,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Idle      string            `json:"idle,omitempty"`
	HTTPPort  int               `json:"http_port,omitempty"`
	// Public opens the sandbox's URL to anyone who reaches the daemon.
	Public bool        `json:"public,omitempty"`
	From   *ForkSource `json:"from,omitempty"`
	// Secrets gives secrets (PUT /v1/secrets/{name}) to every process of
	// the sandbox as environment variables: variable name → secret name.
	// SecretFiles writes them as files, mode 0400, owned by the user loam:
	// absolute path → secret name. A fork takes both from its source
	// unless it gives either.
	Secrets     map[string]string `json:"secrets,omitempty"`
	SecretFiles map[string]string `json:"secret_files,omitempty"`
	// Network is the sandbox's network policy; a new sandbox gets
	// {"egress":"all"} without one, a fork its source's.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Services are started once the sandbox is up, before the create
	// returns (see Service). A fork takes its services from the
	// checkpoint's disk and may not give any.
	Services []Service `json:"services,omitempty"`
	// Node, in a cluster, pins the sandbox to that node instead of the one
	// placement picks: the operator's (admin token) alone.
	Node string `json:"node,omitempty"`
	// Recover is what brings the sandbox back if its node is lost
	// (Sandbox.Recover): RecoverLatestCheckpoint, or "" (none).
	Recover string `json:"recover,omitempty"`
	// Count, with From, makes that many forks at once (1 to
	// MaxForkCount), each created as a fork of its own would be (in a
	// cluster, each placed on its own), and the answer is a ForkList
	// rather than a Sandbox. With a Name the forks are named NAME-1 …
	// NAME-N; without one the daemon picks each name.
	Count int `json:"count,omitempty"`
}

// MaxForkCount is the most forks one create makes (CreateSandbox.Count).
const MaxForkCount = 64

// ForkList is the answer of a create with a count (CreateSandbox.Count):
// every fork, in order (NAME-1 first), each with its sandbox or the error
// that kept it from being made. It is sent with 201 when at least one fork
// was made; when none was, the answer is the first fork's error instead,
// with its own status.
type ForkList struct {
	Forks []ForkResult `json:"forks"`
}

// ForkResult is one fork of a ForkList: the name it was asked to have
// (absent when the daemon picks one), and either the sandbox made or the
// error that kept it from being made, as an error answer would carry it.
type ForkResult struct {
	Name    string   `json:"name,omitempty"`
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// RecoverLatestCheckpoint is the recover policy (CreateSandbox.Recover)
// that brings a sandbox of a lost node back on another from its latest
// checkpoint in the object store.
const RecoverLatestCheckpoint = "latest-checkpoint"

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// TemplateList is the body of GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// AccessToken is the body of GET /v1/sandboxes/{sandbox}/access-token: the
// token that opens a private sandbox's URL (header X-Loam-Access-Token, or
// once as ?loam_token=, which sets a cookie), and the URL itself.
type AccessToken struct {
	URL         string `json:"url"`
	AccessToken string `json:"access_token"`
}

// UpdateSandbox is the body of PATCH /v1/sandboxes/{sandbox}: the settings
// of a sandbox that may change while it lives. A field left out (null)
// stays as it is; Labels, when given, replaces every label. The rest of a
// sandbox (template, resources, env, secrets) is fixed at create; its
// network policy has its own route (PUT …/network).
type UpdateSandbox struct {
	// Labels replaces the sandbox's labels; {} removes them all.
	Labels *map[string]string `json:"labels,omitempty"`
	// Idle is how long the sandbox may go without activity before it
	// sleeps ("10m"; "0" never; "" the daemon's default).
	Idle *string `json:"idle,omitempty"`
	// HTTPPort is the port its URL forwards to.
	HTTPPort *int `json:"http_port,omitempty"`
	// Public opens its URL to anyone who reaches the daemon, or closes it
	// to all but holders of the API or access token.
	Public *bool `json:"public,omitempty"`
	// Recover sets what brings it back if its node is lost
	// (RecoverLatestCheckpoint), or "" for nothing.
	Recover *string `json:"recover,omitempty"`
}
