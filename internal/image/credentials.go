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
	"loam.dev/loam/internal/auth"
	"loam.dev/loam/internal/secret"
)

// Credentials keeps registry credentials sealed in a secret.Store of their
// own (never the sandboxes' secrets), each org its own, and gives each
// org's pulls its keychain (For).
type Credentials struct {
	store secret.Store
	// org is the daemon's own (--org): the org of calls that name no
	// caller.
	org string
}

// NewCredentials keeps credentials in st, those of calls that name no
// caller under org; nil keeps none.
func NewCredentials(st secret.Store, org string) *Credentials {
	return &Credentials{store: st, org: org}
}

// orgOf is the org of a call: its caller's, or the daemon's own.
func (c *Credentials) orgOf(ctx context.Context) string { return auth.OrgOr(ctx, c.org) }

// For is the keychain of org's pulls: its own credentials, then, for the
// daemon's own org alone, the standard Docker config file of the
// daemon's host (authn.DefaultKeychain), which is the operator's.
func (c *Credentials) For(org string) authn.Keychain {
	own := orgKeychain{c: c, org: org}
	if org == c.org {
		return authn.NewMultiKeychain(own, authn.DefaultKeychain)
	}
	return own
}

// orgKeychain is the keychain of one org's stored credentials.
type orgKeychain struct {
	c   *Credentials
	org string
}

// Resolve is ResolveContext without one.
func (k orgKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	return k.ResolveContext(context.Background(), r)
}

// ResolveContext gives the credentials the org stored for r's registry,
// or authn.Anonymous, which lets the next keychain answer.
func (k orgKeychain) ResolveContext(ctx context.Context, r authn.Resource) (authn.Authenticator, error) {
	if k.c.store == nil {
		return authn.Anonymous, nil
	}
	login, err := k.c.get(ctx, k.org, r.RegistryStr())
	if err != nil || login == nil {
		return authn.Anonymous, err
	}
	return &authn.Basic{Username: login.Username, Password: login.Password}, nil
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

// Login stores the credentials for registry, of the caller's org.
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
	if _, err := c.store.Put(ctx, c.orgOf(ctx), credName(reg), secret.NewValue(string(b))); err != nil {
		return nil, fmt.Errorf("storing credentials for %s: %w", reg, err)
	}
	return &api.Registry{Registry: reg, Username: login.Username}, nil
}

// Logout forgets the credentials for registry, of the caller's org.
func (c *Credentials) Logout(ctx context.Context, registry string) error {
	if c.store == nil {
		return api.Errorf(api.CodeNotFound, "no credentials for %s", registry)
	}
	reg, err := checkRegistry(registry)
	if err != nil {
		return err
	}
	if err := c.store.Delete(ctx, c.orgOf(ctx), credName(reg)); err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return api.Errorf(api.CodeNotFound, "no credentials for %s", reg)
		}
		return fmt.Errorf("forgetting credentials for %s: %w", reg, err)
	}
	return nil
}

// List lists the registries the caller's org has credentials for, and
// their user names.
func (c *Credentials) List(ctx context.Context) ([]api.Registry, error) {
	out := []api.Registry{}
	if c.store == nil {
		return out, nil
	}
	org := c.orgOf(ctx)
	list, err := c.store.List(ctx, org)
	if err != nil {
		return nil, fmt.Errorf("listing registry credentials: %w", err)
	}
	for _, s := range list {
		reg, ok := registryOf(s.Name)
		if !ok {
			continue
		}
		login, err := c.get(ctx, org, reg)
		if err != nil {
			return nil, err
		}
		out = append(out, api.Registry{Registry: reg, Username: login.Username})
	}
	return out, nil
}

func (c *Credentials) get(ctx context.Context, org, reg string) (*api.RegistryLogin, error) {
	vals, err := c.store.Resolve(ctx, org, []string{credName(reg)})
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
