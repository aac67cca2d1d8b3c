package secret

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Sandboxes lists the sandboxes (store/sqlite has it): a secret that one
// of them has is not deleted unless forced.
type Sandboxes interface {
	ListSandboxes(ctx context.Context, f store.Filter) ([]*store.Sandbox, error)
}

// Keeper is what the API serves of the secrets (PUT, GET, DELETE
// /v1/secrets): a Store, whose deletes check the sandboxes that have the
// secret.
type Keeper struct {
	store     Store
	sandboxes Sandboxes
	log       *slog.Logger
}

// NewKeeper makes a Keeper over st, whose deletes check sbs.
func NewKeeper(st Store, sbs Sandboxes, log *slog.Logger) *Keeper {
	return &Keeper{store: st, sandboxes: sbs, log: log}
}

// Put stores a secret's value in org (PUT /v1/secrets/{name}). Sandboxes that
// have it get the new value at their next boot, restore or fork.
func (k *Keeper) Put(ctx context.Context, org, name string, value Value) (*api.Secret, error) {
	return k.store.Put(ctx, org, name, value)
}

// List lists the names and times of org's secrets.
func (k *Keeper) List(ctx context.Context, org string) ([]api.Secret, error) {
	return k.store.List(ctx, org)
}

// Delete deletes a secret of org. One that a sandbox of org has is a conflict that names
// the sandboxes, unless force: then they keep running with the value they
// were given, and their next boot, restore or fork goes without it.
func (k *Keeper) Delete(ctx context.Context, org, name string, force bool) error {
	if err := CheckName(name); err != nil {
		return err
	}
	// A secret that is gone is not_found even while sandboxes still name
	// it (a forced delete leaves them naming it): a conflict would send
	// the caller to delete it again, forever.
	secs, err := k.store.List(ctx, org)
	if err != nil {
		return fmt.Errorf("listing secrets: %w", err)
	}
	if !slices.ContainsFunc(secs, func(s api.Secret) bool { return s.Name == name }) {
		return api.Errorf(api.CodeNotFound, "secret %q not found", name)
	}
	if !force {
		sbs, err := k.sandboxes.ListSandboxes(ctx, store.Filter{Org: org})
		if err != nil {
			return err
		}
		var users []string
		for _, sb := range sbs {
			if slices.Contains(slices.Collect(maps.Values(sb.Secrets)), name) ||
				slices.Contains(slices.Collect(maps.Values(sb.SecretFiles)), name) {
				users = append(users, sb.Name)
			}
		}
		if len(users) > 0 {
			return api.Errorf(api.CodeConflict, "secret %q is used by sandbox %s; force (?force=true, loam secret rm --force) deletes it anyway, and they go without it from their next boot", name, strings.Join(users, ", "))
		}
	}
	if err := k.store.Delete(ctx, org, name); err != nil {
		return err
	}
	k.log.Info("secret deleted", "org", org, "secret", name, "force", force)
	return nil
}
