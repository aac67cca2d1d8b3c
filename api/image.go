package api

import "time"

// ImageState is where an image is in its pull. The strings never change.
type ImageState string

// The states of an image.
const (
	ImagePulling ImageState = "pulling" // being downloaded and unpacked
	ImageReady   ImageState = "ready"   // unpacked and cached; sandboxes can start from it
	ImageError   ImageState = "error"   // the pull failed (see Error); pulling again retries it
)

// Image is an OCI image as the API shows it: pulled from a registry, a
// local OCI layout directory or a `docker save` tarball, and unpacked into a
// read-only template that the sandboxes made from it share.
type Image struct {
	// ID is derived from Ref: pulling the same reference again finds it.
	ID string `json:"id"`
	// Ref is the reference as loam reads it: a registry reference in full
	// (index.docker.io/library/python:3.12-slim) or an absolute path on the
	// daemon's host.
	Ref string `json:"ref"`
	// Digest is the manifest's digest, once the pull has resolved it.
	Digest string     `json:"digest,omitempty"`
	State  ImageState `json:"state"`
	Error  string     `json:"error,omitempty"`
	// Size is the bytes of its layers as stored (compressed), once known;
	// Pulled is how many of them the pull has read so far.
	Size   int64 `json:"size"`
	Pulled int64 `json:"pulled"`
	// Config is what the image says about how it runs.
	Config    ImageConfig `json:"config"`
	CreatedAt time.Time   `json:"created_at"`
}

// ImageConfig is the part of an image's configuration a sandbox made from it
// follows: Env under the sandbox's own env, User and WorkingDir as the
// defaults of exec, and Entrypoint followed by Cmd as the service
// "entrypoint" when either is given.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// PullImage is the body of POST /v1/images.
type PullImage struct {
	Ref string `json:"ref"`
}

// ImageList is the body of GET /v1/images.
type ImageList struct {
	Images []Image `json:"images"`
}

// RegistryLogin is the body of PUT /v1/registries/{registry}: the
// credentials loam pulls from that registry with, kept encrypted.
type RegistryLogin struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// Registry is a registry loam has credentials for (never the password).
type Registry struct {
	Registry string `json:"registry"`
	Username string `json:"username"`
}

// RegistryList is the body of GET /v1/registries.
type RegistryList struct {
	Registries []Registry `json:"registries"`
}
