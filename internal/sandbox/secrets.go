package sandbox

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/secret"
	"loam.dev/loam/internal/store"
)

// Secrets gives the values of the secrets sandboxes are given (package
// secret's Store has it).
type Secrets interface {
	// Resolve gives the values of names in org; a name with no secret is
	// left out of the map.
	Resolve(ctx context.Context, org string, names []string) (map[string]secret.Value, error)
}

// maxSecretRefs bounds the secrets a sandbox has, so that their values fit
// the identity the agent takes (see agent.Identity).
const maxSecretRefs = 64

// secretsProtocol is the first agent protocol that takes secrets with the
// identity; an older one, back from an old checkpoint, ignores them.
const secretsProtocol = 4

var errNoSecrets = api.Errorf(api.CodeUnavailable, "this daemon keeps no secrets")

// checkSecretRefs checks a create's secrets and secret_files: valid
// variable names not also in env, clean absolute paths outside the
// directories loam and the kernel own, and secrets that exist.
func (m *Manager) checkSecretRefs(ctx context.Context, req api.CreateSandbox) error {
	if len(req.Secrets) == 0 && len(req.SecretFiles) == 0 {
		return nil
	}
	if m.cfg.Secrets == nil {
		return errNoSecrets
	}
	if len(req.Secrets)+len(req.SecretFiles) > maxSecretRefs {
		return api.Errorf(api.CodeInvalid, "secrets, secret_files: at most %d in all", maxSecretRefs)
	}
	var names []string
	for k, name := range req.Secrets {
		if !envKeyRE.MatchString(k) || strings.HasPrefix(k, "LOAM_") {
			return api.Errorf(api.CodeInvalid, "secrets: %q is not a valid variable name (names starting with LOAM_ are reserved)", k)
		}
		if _, ok := req.Env[k]; ok {
			return api.Errorf(api.CodeInvalid, "secrets: %s is also in env; give it in one of them", k)
		}
		names = append(names, name)
	}
	for p, name := range req.SecretFiles {
		if err := checkSecretPath(p); err != nil {
			return err
		}
		names = append(names, name)
	}
	for _, name := range names {
		if err := secret.CheckName(name); err != nil {
			return err
		}
	}
	got, err := m.cfg.Secrets.Resolve(ctx, m.orgOf(ctx), names)
	if err != nil {
		return fmt.Errorf("looking up secrets: %w", err)
	}
	for _, name := range names {
		if _, ok := got[name]; !ok {
			return api.Errorf(api.CodeInvalid, "secret %q does not exist (PUT /v1/secrets/%s first)", name, name)
		}
	}
	return nil
}

// reservedDirs are where secret files may not go: the agent's own, and
// the kernel's.
var reservedDirs = []string{agent.IdentityDir, filepath.Dir(agent.AgentBinaryPath), "/proc", "/sys", "/dev"}

func checkSecretPath(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" || strings.ContainsRune(p, 0) || len(p) > 1024 {
		return api.Errorf(api.CodeInvalid, "secret_files: %q is not a clean absolute path to a file", p)
	}
	for _, d := range reservedDirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return api.Errorf(api.CodeInvalid, "secret_files: %q is in %s, which loam or the kernel owns", p, d)
		}
	}
	return nil
}

// secretValues resolves sb's secrets for its agent: env name → value and
// file path → value. A secret deleted with force since is left out, and
// logged by name; an agent too old to take secrets (back from a checkpoint
// of an older loam) gets none, logged.
func (m *Manager) secretValues(ctx context.Context, sb *store.Sandbox) (env, files map[string]string, err error) {
	if m.cfg.Secrets == nil || len(sb.Secrets)+len(sb.SecretFiles) == 0 {
		return nil, nil, nil
	}
	if err := m.agents.require(sb, secretsProtocol, "secrets"); err != nil {
		// Not a reason to fail a restore or fork: the sandbox goes
		// without, as after a forced delete, and a fresh boot has them.
		m.log.Warn("the sandbox's agent is too old for secrets; it goes without them", "sandbox", sb.ID)
		return nil, nil, nil
	}
	names := slices.Concat(slices.Collect(maps.Values(sb.Secrets)), slices.Collect(maps.Values(sb.SecretFiles)))
	org := sb.Org
	if org == "" {
		org = m.cfg.Org
	}
	vals, err := m.cfg.Secrets.Resolve(ctx, org, names)
	if err != nil {
		return nil, nil, fmt.Errorf("resolving the secrets of %s: %w", sb.ID, err)
	}
	pick := func(refs map[string]string) map[string]string {
		out := make(map[string]string, len(refs))
		for k, name := range refs {
			v, ok := vals[name]
			if !ok {
				m.log.Warn("a secret the sandbox has is gone; it goes without", "sandbox", sb.ID, "secret", name)
				continue
			}
			out[k] = v.Reveal()
		}
		return out
	}
	return pick(sb.Secrets), pick(sb.SecretFiles), nil
}

// orNil is a copy of m, nil when m is empty: a sandbox without secrets
// shows none.
func orNil(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}
