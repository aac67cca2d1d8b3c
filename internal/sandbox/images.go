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
// image).
type Images interface {
	// Ensure pulls ref unless it is pulled, waits for it, and gives its
	// template and config.
	Ensure(ctx context.Context, ref string) (*image.Resolved, error)
	// Lookup gives the template and config of an image pulled already.
	Lookup(ctx context.Context, ref string) (*image.Resolved, error)
	Pull(ctx context.Context, ref string) (*api.Image, error)
	Get(ctx context.Context, id string) (*api.Image, error)
	List(ctx context.Context) ([]api.Image, error)
	// Remove forgets an image; whether a sandbox uses it is checked here.
	Remove(ctx context.Context, id string) error
}

// Registries keeps the credentials images are pulled with.
type Registries interface {
	Login(ctx context.Context, registry string, login api.RegistryLogin) (*api.Registry, error)
	Logout(ctx context.Context, registry string) error
	List(ctx context.Context) ([]api.Registry, error)
}

// EntrypointService is the service an image's entrypoint and cmd run as.
const EntrypointService = "entrypoint"

// errNoImages refuses image calls of a manager made without images.
var errNoImages = api.Errorf(api.CodeUnavailable, "this daemon has no image support")

// PullImage starts pulling an image; the answer is its state now.
func (m *Manager) PullImage(ctx context.Context, ref string) (*api.Image, error) {
	if m.cfg.Images == nil {
		return nil, errNoImages
	}
	return m.cfg.Images.Pull(ctx, ref)
}

// GetImage is one image, with its pull's progress.
func (m *Manager) GetImage(ctx context.Context, id string) (*api.Image, error) {
	if m.cfg.Images == nil {
		return nil, errNoImages
	}
	return m.cfg.Images.Get(ctx, id)
}

// ListImages lists the images.
func (m *Manager) ListImages(ctx context.Context) ([]api.Image, error) {
	if m.cfg.Images == nil {
		return []api.Image{}, nil
	}
	return m.cfg.Images.List(ctx)
}

// DeleteImage forgets an image; a conflict while a sandbox uses it.
func (m *Manager) DeleteImage(ctx context.Context, id string) error {
	if m.cfg.Images == nil {
		return errNoImages
	}
	// Creates hold the read side from the end of their pull to the end of
	// their boot, so no sandbox of the image appears between the check and
	// the removal.
	m.imageMu.Lock()
	defer m.imageMu.Unlock()
	im, err := m.cfg.Images.Get(ctx, id)
	if err != nil {
		return err
	}
	sbs, err := m.store.ListSandboxes(ctx, store.Filter{})
	if err != nil {
		return fmt.Errorf("deleting image %s: %w", id, err)
	}
	for _, sb := range sbs {
		if sb.Image == im.Ref {
			return api.Errorf(api.CodeConflict, "image %s is used by sandbox %s", im.Ref, sb.Name)
		}
	}
	return m.cfg.Images.Remove(ctx, id)
}

// LoginRegistry stores credentials for a registry.
func (m *Manager) LoginRegistry(ctx context.Context, registry string, login api.RegistryLogin) (*api.Registry, error) {
	if m.cfg.Registries == nil {
		return nil, errNoImages
	}
	return m.cfg.Registries.Login(ctx, registry, login)
}

// LogoutRegistry forgets a registry's credentials.
func (m *Manager) LogoutRegistry(ctx context.Context, registry string) error {
	if m.cfg.Registries == nil {
		return errNoImages
	}
	return m.cfg.Registries.Logout(ctx, registry)
}

// ListRegistries lists the registries with credentials.
func (m *Manager) ListRegistries(ctx context.Context) ([]api.Registry, error) {
	if m.cfg.Registries == nil {
		return []api.Registry{}, nil
	}
	return m.cfg.Registries.List(ctx)
}

// prepareImage pulls a create's image (waiting for it) and makes the record
// follow its config: the image's env under the create's, and its
// entrypoint and cmd as a service unless the create defines one of that
// name. The returned func must be called once the record is stored.
func (m *Manager) prepareImage(ctx context.Context, sb *store.Sandbox, req *api.CreateSandbox) (func(), error) {
	if req.Template != "" {
		return nil, api.Errorf(api.CodeInvalid, "give a template or an image, not both")
	}
	if m.cfg.Images == nil {
		return nil, api.Errorf(api.CodeInvalid, "image: this daemon makes sandboxes from templates only (GET /v1/templates)")
	}
	res, err := m.cfg.Images.Ensure(ctx, req.Image)
	if err != nil {
		return nil, err
	}
	// The lock is taken after the pull, which may take minutes, so that a
	// delete waiting for it holds up no other create; the image is looked
	// up again under it, since a delete may have come in between.
	m.imageMu.RLock()
	if res, err = m.cfg.Images.Lookup(ctx, res.Ref); err != nil {
		m.imageMu.RUnlock()
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
	return m.imageMu.RUnlock, nil
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
func (m *Manager) imageAgentEnv(ctx context.Context, sb *store.Sandbox) ([]string, error) {
	if sb.Image == "" {
		return nil, nil
	}
	if m.cfg.Images == nil {
		return nil, errNoImages
	}
	res, err := m.cfg.Images.Lookup(ctx, sb.Image)
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
func (m *Manager) imageTemplate(ctx context.Context, sb *store.Sandbox) (string, error) {
	if m.cfg.Images == nil {
		return "", errNoImages
	}
	res, err := m.cfg.Images.Lookup(ctx, sb.Image)
	if errors.Is(err, api.ErrNotFound) {
		return "", fmt.Errorf("image %s was removed: %w", sb.Image, err)
	}
	if err != nil {
		return "", err
	}
	return res.Template, nil
}
