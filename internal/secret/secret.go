// Package secret keeps loam's secrets: values encrypted at rest (AES-GCM,
// a random nonce per value, the secret's name bound in as additional data)
// under a key the daemon keeps in its data dir. Values never leave this
// package except as a Value, which redacts itself wherever it is printed,
// logged or marshalled; only Reveal gives the clear text, for injection
// into a sandbox's env or files.
package secret

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"unicode/utf8"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Value is a secret's clear value. Every way of printing it (%v, %s, %q,
// %#v, JSON, slog) shows "[redacted]"; Reveal is the only way out.
type Value struct{ b []byte }

// NewValue wraps a clear value.
func NewValue(s string) Value { return Value{b: []byte(s)} }

// Reveal is the clear value, for a sandbox's env or files only.
func (v Value) Reveal() string { return string(v.b) }

const redacted = "[redacted]"

// String redacts.
func (Value) String() string { return redacted }

// GoString redacts.
func (Value) GoString() string { return redacted }

// Format redacts, whatever the verb.
func (Value) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// MarshalJSON redacts.
func (Value) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// LogValue redacts.
func (Value) LogValue() slog.Value { return slog.StringValue(redacted) }

// Store keeps the secrets of each org. Names are as CheckName allows, and
// unique within an org: the same name in two orgs is two secrets.
type Store interface {
	// Put stores value under name in org, replacing a value of that name.
	Put(ctx context.Context, org, name string, value Value) (*api.Secret, error)
	// List lists org's secrets, by name: names and times, never values.
	List(ctx context.Context, org string) ([]api.Secret, error)
	// Delete removes a secret of org; a not_found *api.Error if there is
	// none.
	Delete(ctx context.Context, org, name string) error
	// Resolve gives the values of names in org, for injection into a
	// sandbox of org. A name with no secret is left out of the map.
	Resolve(ctx context.Context, org string, names []string) (map[string]Value, error)
}

// Records is what Sealed needs of the metadata store (store/sqlite has it).
type Records interface {
	PutSecret(ctx context.Context, sec *store.Secret) error
	GetSecret(ctx context.Context, org, name string) (*store.Secret, error)
	ListSecrets(ctx context.Context, org string) ([]*store.Secret, error)
	DeleteSecret(ctx context.Context, org, name string) error
}

// KeySize is the size of the key Sealed takes (AES-256).
const KeySize = 32

// Sealed is the Store that keeps values sealed with AES-GCM in Records.
type Sealed struct {
	records Records
	aead    cipher.AEAD
}

// NewSealed makes a Store over records with key (KeySize bytes).
func NewSealed(records Records, key []byte) (*Sealed, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("opening the secret store: the key is %d bytes, not %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("opening the secret store: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("opening the secret store: %w", err)
	}
	return &Sealed{records: records, aead: aead}, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,127}$`)

// CheckName checks a secret's name: a letter or _, then letters, digits,
// _ . or -, 128 characters at most (an env name or a simple slug).
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return api.Errorf(api.CodeInvalid, "secret name %q: use a letter or _ then letters, digits, _, . or - (128 at most)", name)
	}
	return nil
}

// checkValue checks a value without ever quoting it.
func checkValue(v Value) error {
	if len(v.b) > api.MaxSecretSize {
		return api.Errorf(api.CodeInvalid, "value: %d bytes, more than the %d a secret may hold", len(v.b), api.MaxSecretSize)
	}
	if !utf8.Valid(v.b) {
		return api.Errorf(api.CodeInvalid, "value: not valid UTF-8")
	}
	if bytes.IndexByte(v.b, 0) >= 0 {
		return api.Errorf(api.CodeInvalid, "value: contains a NUL byte, which no environment variable can hold")
	}
	return nil
}

// Put seals value and stores it.
func (s *Sealed) Put(ctx context.Context, org, name string, value Value) (*api.Secret, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := checkValue(value); err != nil {
		return nil, err
	}
	nonce := make([]byte, s.aead.NonceSize())
	_, _ = rand.Read(nonce) // never fails on Linux
	sealed := s.aead.Seal(nonce, nonce, value.b, []byte(name))
	now := store.Now()
	created := now
	if old, err := s.records.GetSecret(ctx, org, name); err == nil {
		created = old.CreatedAt
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if err := s.records.PutSecret(ctx, &store.Secret{Org: org, Name: name, Sealed: sealed, CreatedAt: created, UpdatedAt: now}); err != nil {
		return nil, err
	}
	return &api.Secret{Name: name, CreatedAt: created, UpdatedAt: now}, nil
}

// List lists names and times.
func (s *Sealed) List(ctx context.Context, org string) ([]api.Secret, error) {
	recs, err := s.records.ListSecrets(ctx, org)
	if err != nil {
		return nil, err
	}
	list := make([]api.Secret, 0, len(recs))
	for _, r := range recs {
		list = append(list, api.Secret{Name: r.Name, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt})
	}
	return list, nil
}

// Delete removes a secret.
func (s *Sealed) Delete(ctx context.Context, org, name string) error {
	err := s.records.DeleteSecret(ctx, org, name)
	if errors.Is(err, store.ErrNotFound) {
		return api.Errorf(api.CodeNotFound, "secret %q not found", name)
	}
	return err
}

// Resolve opens the values of names.
func (s *Sealed) Resolve(ctx context.Context, org string, names []string) (map[string]Value, error) {
	out := make(map[string]Value, len(names))
	for _, name := range names {
		if _, ok := out[name]; ok {
			continue
		}
		rec, err := s.records.GetSecret(ctx, org, name)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		ns := s.aead.NonceSize()
		if len(rec.Sealed) < ns {
			return nil, fmt.Errorf("opening secret %s: sealed value too short", name)
		}
		b, err := s.aead.Open(nil, rec.Sealed[:ns], rec.Sealed[ns:], []byte(name))
		if err != nil {
			// The key changed or the record was tampered with; the
			// error of Open says nothing of the value.
			return nil, fmt.Errorf("opening secret %s: %w", name, err)
		}
		out[name] = Value{b: b}
	}
	return out, nil
}
