package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/randid"
	"loam.dev/loam/internal/store"
)

// KeyStore keeps API keys (store/sqlite is one).
type KeyStore interface {
	CreateKey(ctx context.Context, k *store.Key) error
	KeyByHash(ctx context.Context, hash []byte) (*store.Key, error)
	GetKey(ctx context.Context, org, id string) (*store.Key, error)
	ListKeys(ctx context.Context, org string) ([]*store.Key, error)
	DeleteKey(ctx context.Context, org, id string) error
	TouchKey(ctx context.Context, id string, t time.Time) error
}

// touchEvery is how often at most a key's last use is written to the
// store: a key used by every call of a busy agent should not cost a write
// (an fsync) each time. GET /v1/keys shows the latest use all the same.
const touchEvery = 10 * time.Second

// ErrWrongToken is the answer to a call whose credential is missing,
// unknown, revoked or expired: the same for all four, so that a probe
// learns nothing from it.
var ErrWrongToken = api.Errorf(api.CodeUnauthorized, "missing or wrong token: send Authorization: Bearer $LOAM_TOKEN (the token of loam serve, or an API key)")

// Keys authenticates calls and manages API keys.
type Keys struct {
	org string
	// admin is the admin token's SHA-256, nil for none: a cluster keeps
	// the hash alone (made by its first node), and every node checks the
	// token against it.
	admin []byte
	store KeyStore
	log   *slog.Logger
	now   func() time.Time

	mu sync.Mutex
	// open holds, per key id, the cancels of the calls still running with
	// that key (streams: an exec, a port stream), ended when it is revoked.
	open map[string]map[*openCall]struct{}
	// used is each key's last use not yet written to the store; written
	// the time it was last written.
	used    map[string]time.Time
	written map[string]time.Time
}

type openCall struct {
	org    string
	cancel context.CancelCauseFunc
}

// NewKeys makes the authenticator of a daemon whose org is org and whose
// admin token is admin, keeping keys in st (nil: the admin token alone).
func NewKeys(org, admin string, st KeyStore, log *slog.Logger) *Keys {
	var hash []byte
	if admin != "" {
		hash = AdminHash(admin)
	}
	return NewKeysForHash(org, hash, st, log)
}

// NewKeysForHash is NewKeys for an admin token known by its hash alone
// (AdminHash; nil: no admin token), as a cluster's nodes know it.
func NewKeysForHash(org string, adminHash []byte, st KeyStore, log *slog.Logger) *Keys {
	return &Keys{org: org, admin: adminHash, store: st, log: log, now: store.Now,
		open: map[string]map[*openCall]struct{}{}, used: map[string]time.Time{}, written: map[string]time.Time{}}
}

// AdminHash is the hash of an admin token that NewKeysForHash takes. The
// token is 52 random characters (or the operator's own), so a plain
// SHA-256 is as good as a slow hash: there is nothing to guess.
func AdminHash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// Org is the daemon's own org, whose admin the admin token is.
func (k *Keys) Org() string { return k.org }

// IsAdminToken reports whether token is the admin token of loam serve.
func (k *Keys) IsAdminToken(token string) bool {
	return len(k.admin) > 0 && token != "" && subtle.ConstantTimeCompare(AdminHash(token), k.admin) == 1
}

// Admin is the principal of the admin token.
func (k *Keys) Admin() Principal {
	return Principal{Org: k.org, Key: api.AdminKeyID, Scope: api.ScopeAdmin, Operator: true}
}

// Authenticate finds who token belongs to: the admin token, or a key that
// is neither revoked nor expired. Any other token is ErrWrongToken.
func (k *Keys) Authenticate(ctx context.Context, token string) (Principal, error) {
	if k.IsAdminToken(token) {
		return k.Admin(), nil
	}
	if k.store == nil || !strings.HasPrefix(token, api.KeyPrefix) {
		return Principal{}, ErrWrongToken
	}
	hash := sha256.Sum256([]byte(token))
	rec, err := k.store.KeyByHash(ctx, hash[:])
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, ErrWrongToken
	}
	if err != nil {
		return Principal{}, fmt.Errorf("%w: %w", api.Errorf(api.CodeUnavailable, "cannot check the key now; try again"), err)
	}
	now := k.now()
	if rec.ExpiresAt != nil && !now.Before(*rec.ExpiresAt) {
		return Principal{}, ErrWrongToken
	}
	k.mu.Lock()
	k.used[rec.ID] = now
	k.mu.Unlock()
	p := Principal{Org: rec.Org, Key: rec.ID, Scope: rec.Scope, Labels: rec.Labels}
	if rec.ExpiresAt != nil {
		p.Expires = *rec.ExpiresAt
	}
	return p, nil
}

// Principal is who key id of org is, as Authenticate would find it from
// its secret: the admin token's principal for api.AdminKeyID, else the key
// if it is neither revoked nor expired (ErrWrongToken otherwise). A web
// console session names its key so: revoking the key ends the session.
func (k *Keys) Principal(ctx context.Context, org, id string) (Principal, error) {
	if id == api.AdminKeyID {
		return k.Admin(), nil
	}
	if k.store == nil {
		return Principal{}, ErrWrongToken
	}
	rec, err := k.store.GetKey(ctx, org, id)
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, ErrWrongToken
	}
	if err != nil {
		return Principal{}, fmt.Errorf("%w: %w", api.Errorf(api.CodeUnavailable, "cannot check the key now; try again"), err)
	}
	now := k.now()
	if rec.ExpiresAt != nil && !now.Before(*rec.ExpiresAt) {
		return Principal{}, ErrWrongToken
	}
	k.mu.Lock()
	k.used[rec.ID] = now
	k.mu.Unlock()
	p := Principal{Org: rec.Org, Key: rec.ID, Scope: rec.Scope, Labels: rec.Labels}
	if rec.ExpiresAt != nil {
		p.Expires = *rec.ExpiresAt
	}
	return p, nil
}

// Hold returns a context for a call of p that ends when p's key is revoked
// or expires, besides when ctx ends; release it when the call ends. Streams
// (an exec, a port stream) run under it, so that revoking a key ends them.
func (k *Keys) Hold(ctx context.Context, p Principal) (context.Context, func()) {
	if p.Key == api.AdminKeyID || p.Key == "" {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var stop context.CancelFunc = func() {}
	if !p.Expires.IsZero() {
		ctx, stop = context.WithDeadlineCause(ctx, p.Expires, fmt.Errorf("key %s expired", p.Key))
	}
	c := &openCall{org: p.Org, cancel: cancel}
	k.mu.Lock()
	if k.open[p.Key] == nil {
		k.open[p.Key] = map[*openCall]struct{}{}
	}
	k.open[p.Key][c] = struct{}{}
	k.mu.Unlock()
	return ctx, func() {
		k.mu.Lock()
		delete(k.open[p.Key], c)
		if len(k.open[p.Key]) == 0 {
			delete(k.open, p.Key)
		}
		k.mu.Unlock()
		stop()
		cancel(nil)
	}
}

// Create makes a key in org for the caller by. A key limited by labels
// makes only keys limited by them too.
func (k *Keys) Create(ctx context.Context, by Principal, org string, req api.CreateKey) (*api.Key, error) {
	if k.store == nil {
		return nil, api.Errorf(api.CodeUnavailable, "this daemon keeps no API keys")
	}
	if err := checkKeyName(req.Name); err != nil {
		return nil, err
	}
	if req.Scope == "" {
		req.Scope = api.ScopeWrite
	}
	if !req.Scope.Valid() {
		return nil, api.Errorf(api.CodeInvalid, "scope %q: want admin, write or read", req.Scope)
	}
	if !by.Allows(req.Scope) {
		return nil, api.Errorf(api.CodeForbidden, "a key of scope %s cannot make a key of scope %s", by.Scope, req.Scope)
	}
	if err := api.CheckLabels(req.Labels); err != nil {
		return nil, err
	}
	labels := req.Labels
	if by.Org == org {
		var err error
		if labels, err = by.WithLabels(req.Labels); err != nil {
			return nil, err
		}
	}
	now := k.now()
	rec := &store.Key{Key: api.Key{
		ID: newKeyID(), Name: req.Name, Org: org, Scope: req.Scope, Labels: labels,
		CreatedBy: by.Key, CreatedAt: now,
	}}
	if rec.Labels == nil {
		rec.Labels = map[string]string{}
	}
	if req.ExpiresIn != "" {
		d, err := api.ParseLifetime(req.ExpiresIn)
		if err != nil {
			return nil, api.Errorf(api.CodeInvalid, "expires_in: %v", err)
		}
		t := now.Add(d)
		rec.ExpiresAt = &t
	}
	secret := api.KeyPrefix + randid.String(40)
	hash := sha256.Sum256([]byte(secret))
	rec.Hash = hash[:]
	store.AuditFrom(ctx).SetTarget("keys/" + rec.ID)
	if err := k.store.CreateKey(ctx, rec); err != nil {
		return nil, err
	}
	out := rec.Key
	out.Secret = secret
	return &out, nil
}

// List lists the keys of org, oldest first, with their latest use.
func (k *Keys) List(ctx context.Context, org string) ([]api.Key, error) {
	if k.store == nil {
		return []api.Key{}, nil
	}
	recs, err := k.store.ListKeys(ctx, org)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]api.Key, 0, len(recs))
	for _, r := range recs {
		if t, ok := k.used[r.ID]; ok && (r.LastUsedAt == nil || t.After(*r.LastUsedAt)) {
			r.LastUsedAt = &t
		}
		out = append(out, r.Key)
	}
	return out, nil
}

// Revoke deletes key id of org: new calls with it fail at once, and the
// calls still open with it end.
func (k *Keys) Revoke(ctx context.Context, org, id string) error {
	if k.store == nil {
		return api.Errorf(api.CodeNotFound, "key %q not found", id)
	}
	if err := k.store.DeleteKey(ctx, org, id); errors.Is(err, store.ErrNotFound) {
		return api.Errorf(api.CodeNotFound, "key %q not found", id)
	} else if err != nil {
		return err
	}
	k.Forget(id)
	return nil
}

// Forget ends the calls still open with keys ids, which are gone from the
// store (revoked, or deleted with their org), and drops their last uses.
func (k *Keys) Forget(ids ...string) {
	for _, id := range ids {
		k.mu.Lock()
		calls := k.open[id]
		delete(k.open, id)
		delete(k.used, id)
		delete(k.written, id)
		k.mu.Unlock()
		for c := range calls {
			c.cancel(fmt.Errorf("key %s was revoked", id))
		}
	}
}

// ForgetOrg ends the calls still open with any key of org, which is
// deleted with its keys: those the delete listed (Forget) and any made
// while it ran.
func (k *Keys) ForgetOrg(org string) {
	var ids []string
	k.mu.Lock()
	for id, calls := range k.open {
		for c := range calls {
			if c.org == org {
				ids = append(ids, id)
				break
			}
		}
	}
	k.mu.Unlock()
	k.Forget(ids...)
}

// Run writes the keys' last uses to the store every touchEvery until ctx
// ends, then once more.
func (k *Keys) Run(ctx context.Context) error {
	if k.store == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(touchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			k.flush(context.WithoutCancel(ctx))
			return nil
		case <-t.C:
			k.flush(ctx)
		}
	}
}

// flush writes the last uses newer than what the store has.
func (k *Keys) flush(ctx context.Context) {
	k.mu.Lock()
	todo := map[string]time.Time{}
	for id, t := range k.used {
		if w, ok := k.written[id]; !ok || t.After(w) {
			todo[id] = t
		}
	}
	k.mu.Unlock()
	for id, t := range todo {
		if err := k.store.TouchKey(ctx, id, t); err != nil {
			k.log.Warn("recording a key's last use", "key", id, "err", err)
			continue
		}
		k.mu.Lock()
		if _, ok := k.used[id]; ok {
			k.written[id] = t
		}
		k.mu.Unlock()
	}
}

// checkKeyName refuses an empty, long or unprintable name.
func checkKeyName(name string) error {
	if name == "" {
		return api.Errorf(api.CodeInvalid, "a key needs a name (what it is for, such as ci or agent-7)")
	}
	if len(name) > api.MaxKeyName || !utf8.ValidString(name) {
		return api.Errorf(api.CodeInvalid, "key name: at most %d bytes of UTF-8", api.MaxKeyName)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return api.Errorf(api.CodeInvalid, "key name %q: only printable characters", name)
		}
	}
	return nil
}

func newKeyID() string { return "key-" + randid.String(12) }
