package api

import "time"

// Kinds of template (Template.Kind).
const (
	// TemplateBuiltin is a template loam builds itself (base, busybox).
	TemplateBuiltin = "builtin"
	// TemplateCheckpoint is a checkpoint kept under a name: its disk and,
	// when it has memory, its memory image, so sandboxes made from it start
	// with its processes running.
	TemplateCheckpoint = "checkpoint"
	// TemplateImage is an OCI image pulled by the daemon (see Image); its
	// name is the image's ref, as a create's "image" gives it.
	TemplateImage = "image"
)

// States of a template (Template.State).
const (
	// TemplateReady: sandboxes can be made from it at once.
	TemplateReady = "ready"
	// TemplatePending: a built-in not built yet; the first sandbox of it
	// waits for its build.
	TemplatePending = "pending"
	// TemplateBuilding: a built-in being built now, or an image being
	// pulled.
	TemplateBuilding = "building"
	// TemplateFailed: its last build or pull failed (Error says why); the
	// next sandbox of a built-in tries again, an image is pulled again
	// after it is deleted.
	TemplateFailed = "failed"
)

// Template is a root filesystem sandboxes can be made from: a built-in one,
// or a checkpoint kept as a template (memory included when it had memory).
type Template struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Default     bool   `json:"default"`
	// Ready is true once the template is built and cached; the first sandbox
	// of a template that is not ready waits for the build.
	Ready bool `json:"ready"`
	// Kind is TemplateBuiltin, TemplateCheckpoint or TemplateImage.
	Kind string `json:"kind"`
	// State is TemplateReady, TemplatePending, TemplateBuilding or
	// TemplateFailed.
	State string `json:"state"`
	// Error is why a failed template failed.
	Error string `json:"error,omitempty"`
	// Progress is how far the template's preparation (its build, then its
	// import into the daemon's disk pool) has got, in percent: 100 once it
	// is ready, 0 before it starts or while another daemon on the host
	// builds it.
	Progress int `json:"progress"`
	// Memory is true for a template with a memory image: a sandbox made
	// from it starts with its processes running, like a fork.
	Memory bool `json:"memory"`
	// SizeBytes is what its files (and memory image) hold; 0 for a
	// built-in not built yet.
	SizeBytes int64 `json:"size_bytes"`
	// Uses is how many sandboxes were made from it and still exist. A
	// template in use cannot be deleted.
	Uses int `json:"uses"`
	// From is the checkpoint a checkpoint template was made from, as
	// "sandbox/checkpoint".
	From string `json:"from,omitempty"`
	// CreatedAt is when a checkpoint template was made.
	CreatedAt *time.Time `json:"created_at,omitempty"`
	// Node, in a cluster, is the node that keeps a checkpoint template:
	// until templates travel, its sandboxes are made there alone. A
	// template another node keeps is listed by name and node only.
	Node string `json:"node,omitempty"`
}

// CreateTemplate is the body of POST /v1/templates: keep checkpoint From
// as template Name. The template outlives the sandbox and the checkpoint.
type CreateTemplate struct {
	Name string      `json:"name"`
	From *ForkSource `json:"from"`
	// Pool, when not 0, keeps a warm pool of that many sandboxes of the
	// template (see Pool), as PUT /v1/templates/{template}/pool does.
	Pool int `json:"pool,omitempty"`
}
