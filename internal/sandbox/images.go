package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/image"
	"loam.dev/loam/internal/store"
)

// Images pulls OCI images and gives sandboxes their templates (package
// image's Service).
type Images interface {
	// Ensure pulls ref for org unless it is pulled, waits for it, and
	// gives its template and config.
	Ensure(ctx context.Context, org, ref string) (*image.Resolved, error)
	// Lookup gives the template and config of an image pulled already,
	// as a sandbox of org finds it.
	Lookup(ctx context.Context, org, ref string) (*image.Resolved, error)
	// Hold is Lookup for a create: the image cannot be deleted until
	// release is called.
	Hold(ctx context.Context, org, ref string) (res *image.Resolved, release func(), err error)
}

// EntrypointService is the service an image's entrypoint and cmd run as.
const EntrypointService = "entrypoint"

// errNoImages refuses image calls of a manager made without images.
var errNoImages = api.Errorf(api.CodeUnavailable, "this daemon has no image support")

// prepareImage pulls a create's image (waiting for it) and makes the record
// follow its config: the image's env under the create's, and its
// entrypoint and cmd as a service unless the create defines one of that
// name. The returned func must be called once the record is stored.
func (mc *machine) prepareImage(ctx context.Context, sb *store.Sandbox, req *api.CreateSandbox) (func(), error) {
	m := mc.m
	if req.Template != "" {
		return nil, api.Errorf(api.CodeInvalid, "give a template or an image, not both")
	}
	if m.cfg.Images == nil {
		return nil, api.Errorf(api.CodeInvalid, "image: this daemon makes sandboxes from templates only (GET /v1/templates)")
	}
	res, err := m.cfg.Images.Ensure(ctx, sb.Org, req.Image)
	if err != nil {
		return nil, err
	}
	// Held after the pull, which may take minutes, so that a delete
	// waiting for it holds up no other create; the image is looked up
	// again, since a delete may have come in between.
	res, release, err := m.cfg.Images.Hold(ctx, sb.Org, res.Ref)
	if err != nil {
		return nil, err
	}
	sb.Template, sb.Image = "", res.Ref
	sb.Env = imageEnv(res.Config, req.Env)
	if cmd := slices.Concat(res.Config.Entrypoint, res.Config.Cmd); len(cmd) > 0 &&
		!slices.ContainsFunc(req.Services, func(s api.Service) bool { return s.Name == EntrypointService }) {
		// Not restarted, as docker run does not restart: an image whose
		// command exits (a shell, python) leaves the sandbox up for exec.
		req.Services = append(req.Services, api.Service{Name: EntrypointService, Cmd: cmd, Restart: api.RestartNever})
	}
	return release, nil
}

// imageEnv is an image's env with the sandbox's own over it.
func imageEnv(cfg api.ImageConfig, own map[string]string) map[string]string {
	env := map[string]string{}
	for _, kv := range cfg.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	maps.Copy(env, own)
	return env
}

// imageAgentEnv is what a sandbox's agent is told of its image: the
// default user and directory of exec and services.
func (mc *machine) imageAgentEnv(ctx context.Context, sb *store.Sandbox) ([]string, error) {
	m := mc.m
	if sb.Image == "" {
		return nil, nil
	}
	if m.cfg.Images == nil {
		return nil, errNoImages
	}
	res, err := m.cfg.Images.Lookup(ctx, sb.Org, sb.Image)
	if err != nil {
		return nil, fmt.Errorf("finding image %s: %w", sb.Image, err)
	}
	user, _, _ := strings.Cut(res.Config.User, ":")
	if user == "" {
		user = "root"
	}
	env := []string{agent.EnvUser + "=" + user}
	if res.Config.WorkingDir != "" {
		env = append(env, agent.EnvDir+"="+res.Config.WorkingDir)
	}
	return env, nil
}

// imageTemplate is the template of a sandbox's image.
func (mc *machine) imageTemplate(ctx context.Context, sb *store.Sandbox) (string, error) {
	m := mc.m
	if m.cfg.Images == nil {
		return "", errNoImages
	}
	res, err := m.cfg.Images.Lookup(ctx, sb.Org, sb.Image)
	if errors.Is(err, api.ErrNotFound) {
		return "", fmt.Errorf("image %s was removed: %w", sb.Image, err)
	}
	if err != nil {
		return "", err
	}
	return res.Template, nil
}
