package image

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/secret"
)

// Credentials keeps registry credentials sealed in a secret.Store of their
// own (never the sandboxes' secrets), and is the keychain pulls use ahead
// of the standard Docker config file (authn.DefaultKeychain).
type Credentials struct {
	store secret.Store
	// org is whose credentials these are: the daemon's own (--org).
	// Images are pulled once per reference for every org, so their
	// credentials are the daemon's, kept under its org.
	org string
}

// NewCredentials keeps credentials of org in st; nil keeps none.
func NewCredentials(st secret.Store, org string) *Credentials {
	return &Credentials{store: st, org: org}
}

// A registry's credential is stored under a name secret.CheckName allows,
// since registries hold ':' and may be long: "r_" and the host in hex.
func credName(registry string) string { return "r_" + hex.EncodeToString([]byte(registry)) }

func registryOf(cred string) (string, bool) {
	b, err := hex.DecodeString(strings.TrimPrefix(cred, "r_"))
	return string(b), err == nil && strings.HasPrefix(cred, "r_")
}

// checkRegistry is the registry's host as references name it
// (docker.io becomes index.docker.io).
func checkRegistry(registry string) (string, error) {
	r, err := name.NewRegistry(registry)
	if err != nil || registry == "" || strings.Contains(registry, "/") {
		return "", api.Errorf(api.CodeInvalid, "registry: %q is not a registry host (such as ghcr.io or localhost:5000)", registry)
	}
	return r.RegistryStr(), nil
}

// Login stores the credentials for registry.
func (c *Credentials) Login(ctx context.Context, registry string, login api.RegistryLogin) (*api.Registry, error) {
	if c.store == nil {
		return nil, api.Errorf(api.CodeUnavailable, "this daemon keeps no registry credentials")
	}
	reg, err := checkRegistry(registry)
	if err != nil {
		return nil, err
	}
	if login.Username == "" || login.Password == "" {
		return nil, api.Errorf(api.CodeInvalid, "give username and password")
	}
	b, err := json.Marshal(login)
	if err != nil {
		return nil, err
	}
	if _, err := c.store.Put(ctx, c.org, credName(reg), secret.NewValue(string(b))); err != nil {
		return nil, fmt.Errorf("storing credentials for %s: %w", reg, err)
	}
	return &api.Registry{Registry: reg, Username: login.Username}, nil
}

// Logout forgets the credentials for registry.
func (c *Credentials) Logout(ctx context.Context, registry string) error {
	if c.store == nil {
		return api.Errorf(api.CodeNotFound, "no credentials for %s", registry)
	}
	reg, err := checkRegistry(registry)
	if err != nil {
		return err
	}
	if err := c.store.Delete(ctx, c.org, credName(reg)); err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return api.Errorf(api.CodeNotFound, "no credentials for %s", reg)
		}
		return fmt.Errorf("forgetting credentials for %s: %w", reg, err)
	}
	return nil
}

// List lists the registries with credentials, and their user names.
func (c *Credentials) List(ctx context.Context) ([]api.Registry, error) {
	out := []api.Registry{}
	if c.store == nil {
		return out, nil
	}
	list, err := c.store.List(ctx, c.org)
	if err != nil {
		return nil, fmt.Errorf("listing registry credentials: %w", err)
	}
	for _, s := range list {
		reg, ok := registryOf(s.Name)
		if !ok {
			continue
		}
		login, err := c.get(ctx, reg)
		if err != nil {
			return nil, err
		}
		out = append(out, api.Registry{Registry: reg, Username: login.Username})
	}
	return out, nil
}

func (c *Credentials) get(ctx context.Context, reg string) (*api.RegistryLogin, error) {
	vals, err := c.store.Resolve(ctx, c.org, []string{credName(reg)})
	if err != nil {
		return nil, fmt.Errorf("reading credentials for %s: %w", reg, err)
	}
	v, ok := vals[credName(reg)]
	if !ok {
		return nil, nil
	}
	var login api.RegistryLogin
	if err := json.Unmarshal([]byte(v.Reveal()), &login); err != nil {
		return nil, fmt.Errorf("reading credentials for %s: %w", reg, err)
	}
	return &login, nil
}

// Resolve is ResolveContext without one.
func (c *Credentials) Resolve(r authn.Resource) (authn.Authenticator, error) {
	return c.ResolveContext(context.Background(), r)
}

// ResolveContext gives the credentials stored for r's registry, or
// authn.Anonymous, which lets the next keychain answer.
func (c *Credentials) ResolveContext(ctx context.Context, r authn.Resource) (authn.Authenticator, error) {
	if c.store == nil {
		return authn.Anonymous, nil
	}
	login, err := c.get(ctx, r.RegistryStr())
	if err != nil || login == nil {
		return authn.Anonymous, err
	}
	return &authn.Basic{Username: login.Username, Password: login.Password}, nil
}
