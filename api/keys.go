package api

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Scope is what an API key may do in its org. Each scope includes the ones
// below it: admin ⊃ write ⊃ read.
type Scope string

// The scopes of API keys.
const (
	// ScopeRead lists and gets: no exec, no files, no URLs with access,
	// no logs.
	ScopeRead Scope = "read"
	// ScopeWrite makes, changes and deletes sandboxes, their checkpoints,
	// templates, images and secrets, and runs commands in them; no keys.
	ScopeWrite Scope = "write"
	// ScopeAdmin is everything in the org: keys and the audit log too.
	ScopeAdmin Scope = "admin"
)

// rank orders scopes; 0 is not a scope.
func (s Scope) rank() int {
	switch s {
	case ScopeRead:
		return 1
	case ScopeWrite:
		return 2
	case ScopeAdmin:
		return 3
	}
	return 0
}

// Valid reports whether s is one of the scopes.
func (s Scope) Valid() bool { return s.rank() > 0 }

// Includes reports whether a key of scope s may make a call that needs
// scope need.
func (s Scope) Includes(need Scope) bool { return s.Valid() && s.rank() >= need.rank() }

// KeyPrefix starts every API key's secret, so that a secret found in a
// log or a repository is recognisable as a loam key (the admin token of
// loam serve is loam_…, sandboxes' access tokens loam_at_…).
const KeyPrefix = "loam_key_"

// MaxKeyName is the longest a key's name may be, in bytes.
const MaxKeyName = 128

// CreateKey is the body of POST /v1/keys (and POST /v1/orgs/{org}/keys).
type CreateKey struct {
	// Name says what the key is for; names need not be unique.
	Name string `json:"name"`
	// Scope defaults to write.
	Scope Scope `json:"scope,omitempty"`
	// ExpiresIn is how long the key lives: a Go duration ("720h") or a
	// number of days ("30d"). Empty: the key never expires.
	ExpiresIn string `json:"expires_in,omitempty"`
	// Labels limit the key to the sandboxes that have all of them; every
	// sandbox it makes or forks gets them.
	Labels map[string]string `json:"labels,omitempty"`
}

// Key is an API key as the API shows it. Secret is set only in the answer
// of the call that made it: loam keeps only its hash.
type Key struct {
	ID     string            `json:"id"`
	Name   string            `json:"name"`
	Org    string            `json:"org"`
	Scope  Scope             `json:"scope"`
	Labels map[string]string `json:"labels"`
	// CreatedBy is the id of the key that made this one, or "admin" for
	// the token of loam serve.
	CreatedBy  string     `json:"created_by"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	Secret     string     `json:"secret,omitempty"`
}

// KeyList is the body of GET /v1/keys.
type KeyList struct {
	Keys []Key `json:"keys"`
}

// AdminKeyID is the key id the audit log and created_by give the admin
// token of loam serve.
const AdminKeyID = "admin"

// ParseLifetime reads a key's lifetime: a Go duration ("720h", "90m") or
// a whole number of days ("30d"). It must be positive and at most ten
// years.
func ParseLifetime(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("lifetime %q: want a duration such as 720h or a number of days such as 30d", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		d, err = time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("lifetime %q: want a duration such as 720h or a number of days such as 30d", s)
		}
	}
	if d <= 0 || d > 10*365*24*time.Hour {
		return 0, fmt.Errorf("lifetime %q: must be more than 0 and at most 3650d", s)
	}
	return d, nil
}

// AuditEvent is one record of the audit log: a call that changed something.
type AuditEvent struct {
	// Seq orders the log; a later event has a larger one.
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	Org  string    `json:"org"`
	// Key is the id of the key that made the call (AdminKeyID for the
	// admin token, "console" prefixed for a console session's).
	Key    string `json:"key"`
	Action string `json:"action"`
	// Target is what the call acted on, as the path of its route below
	// /v1/ (sandboxes/scratch/checkpoints/v2).
	Target string `json:"target"`
	// Outcome is "ok", or the error code the call answered with.
	Outcome string `json:"outcome"`
	// Client is the address the call came from.
	Client string `json:"client"`
}

// AuditList is the body of GET /v1/audit, oldest first.
type AuditList struct {
	Events []AuditEvent `json:"events"`
}

// MaxAuditPage is the most events GET /v1/audit answers at once; a client
// asks for more with since_seq.
const MaxAuditPage = 1000
