// Package columns is how the SQL stores (store/sqlite, store/postgres)
// keep a record's structured fields in text columns: times to the
// nanosecond in a layout that sorts as the time does, maps and structs as
// JSON. Both stores write and read the same text, so their records round
// trip alike, and a record moved between them needs no conversion. The
// audit log's query is here too (AuditQuery), so both page it alike.
package columns

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// SandboxNames and CheckpointNames are the columns of the sandboxes and
// checkpoints tables, in the order the stores read and write them.
const (
	SandboxNames = `id, name, state, template, image, resources, env, labels, idle,
	http_port, url, from_source, created_at, net_index, agent_token,
	checkpoint_seq, auto_seq, error, agent_gen, restore_target, secrets, secret_files, public, network, pool, org,
	version, node, recover, handover`
	CheckpointNames = `sandbox_id, id, name, comment, memory, auto, created_at,
	sandbox_name, template, image, resources, agent_token, agent_gen, inside`
	// SecretNames are those of the tables of sealed values: secrets and
	// registry_credentials, which have one shape.
	SecretNames         = `org, name, sealed, created_at, updated_at`
	AuditNames          = `seq, time, org, key, action, target, outcome, client`
	ConsoleSessionNames = `key, csrf_token, expires_at, org, api_key`
)

// timeLayout keeps a time to the nanosecond, in UTC, fixed width, so text
// order is time order.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// FormatTime is t as a column; an error for a year outside 0 to 9999,
// which the layout cannot hold in order.
func FormatTime(t time.Time) (string, error) {
	t = t.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		return "", fmt.Errorf("time %s is outside years 0 to 9999", t)
	}
	return t.Format(timeLayout), nil
}

// ParseTime reads a column FormatTime wrote.
func ParseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}

// MarshalMap encodes m as a JSON object; nil as {}, so a labels filter and
// readers of the database see one form for "no entries".
func MarshalMap(m map[string]string) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// UnmarshalMap decodes a JSON object into a map that is never nil: the API
// shows {} rather than null.
func UnmarshalMap(s string) (map[string]string, error) {
	m := map[string]string{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, err
	}
	if m == nil { // the text was null
		m = map[string]string{}
	}
	return m, nil
}

// unmarshalRefs decodes a map of secret references; nil when it is empty,
// as the API leaves them out.
func unmarshalRefs(s string) (map[string]string, error) {
	m, err := UnmarshalMap(s)
	if err != nil || len(m) == 0 {
		return nil, err
	}
	return m, nil
}

// Sandbox is a sandbox record's fields that are kept as text; the rest
// are its columns as they are.
type Sandbox struct {
	CreatedAt, Resources, Env, Labels, Secrets, SecretFiles, Network string
	// From is nil (NULL) for a sandbox that is not a fork.
	From *string
}

// EncodeSandbox is sb's text fields.
func EncodeSandbox(sb *store.Sandbox) (Sandbox, error) {
	var c Sandbox
	var err error
	if c.CreatedAt, err = FormatTime(sb.CreatedAt); err != nil {
		return c, fmt.Errorf("encoding created_at: %w", err)
	}
	if c.Resources, err = marshal(sb.Resources); err != nil {
		return c, fmt.Errorf("encoding resources: %w", err)
	}
	if c.Env, err = MarshalMap(sb.Env); err != nil {
		return c, fmt.Errorf("encoding env: %w", err)
	}
	if c.Labels, err = MarshalMap(sb.Labels); err != nil {
		return c, fmt.Errorf("encoding labels: %w", err)
	}
	if c.Secrets, err = MarshalMap(sb.Secrets); err != nil {
		return c, fmt.Errorf("encoding secrets: %w", err)
	}
	if c.SecretFiles, err = MarshalMap(sb.SecretFiles); err != nil {
		return c, fmt.Errorf("encoding secret_files: %w", err)
	}
	if sb.From != nil {
		from, err := marshal(sb.From)
		if err != nil {
			return c, fmt.Errorf("encoding from: %w", err)
		}
		c.From = &from
	}
	if c.Network, err = marshal(sb.Network); err != nil {
		return c, fmt.Errorf("encoding network: %w", err)
	}
	return c, nil
}

// Decode sets sb's text fields from c; sb.ID names the record in errors.
func (c Sandbox) Decode(sb *store.Sandbox) error {
	var err error
	if sb.CreatedAt, err = ParseTime(c.CreatedAt); err != nil {
		return fmt.Errorf("decoding created_at of sandbox %s: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(c.Resources), &sb.Resources); err != nil {
		return fmt.Errorf("decoding resources of sandbox %s: %w", sb.ID, err)
	}
	if sb.Env, err = UnmarshalMap(c.Env); err != nil {
		return fmt.Errorf("decoding env of sandbox %s: %w", sb.ID, err)
	}
	if sb.Labels, err = UnmarshalMap(c.Labels); err != nil {
		return fmt.Errorf("decoding labels of sandbox %s: %w", sb.ID, err)
	}
	if sb.Secrets, err = unmarshalRefs(c.Secrets); err != nil {
		return fmt.Errorf("decoding secrets of sandbox %s: %w", sb.ID, err)
	}
	if sb.SecretFiles, err = unmarshalRefs(c.SecretFiles); err != nil {
		return fmt.Errorf("decoding secret_files of sandbox %s: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(c.Network), &sb.Network); err != nil {
		return fmt.Errorf("decoding network of sandbox %s: %w", sb.ID, err)
	}
	sb.From = nil
	if c.From != nil {
		sb.From = new(api.ForkSource)
		if err := json.Unmarshal([]byte(*c.From), sb.From); err != nil {
			return fmt.Errorf("decoding from of sandbox %s: %w", sb.ID, err)
		}
	}
	return nil
}

// Checkpoint is a checkpoint record's fields that are kept as text.
type Checkpoint struct {
	CreatedAt, Resources string
	// Name is nil (NULL) for an unnamed checkpoint, so that unnamed ones
	// never collide on "" under UNIQUE (sandbox_id, name).
	Name *string
}

// EncodeCheckpoint is cp's text fields.
func EncodeCheckpoint(cp *store.Checkpoint) (Checkpoint, error) {
	var c Checkpoint
	var err error
	if c.CreatedAt, err = FormatTime(cp.CreatedAt); err != nil {
		return c, fmt.Errorf("encoding created_at: %w", err)
	}
	if c.Resources, err = marshal(cp.Resources); err != nil {
		return c, fmt.Errorf("encoding resources: %w", err)
	}
	if cp.Name != "" {
		name := cp.Name
		c.Name = &name
	}
	return c, nil
}

// Decode sets cp's text fields from c; cp.ID names the record in errors.
func (c Checkpoint) Decode(cp *store.Checkpoint) error {
	var err error
	cp.Name = ""
	if c.Name != nil {
		cp.Name = *c.Name
	}
	if cp.CreatedAt, err = ParseTime(c.CreatedAt); err != nil {
		return fmt.Errorf("decoding created_at of checkpoint %s: %w", cp.ID, err)
	}
	if err := json.Unmarshal([]byte(c.Resources), &cp.Resources); err != nil {
		return fmt.Errorf("decoding resources of checkpoint %s: %w", cp.ID, err)
	}
	return nil
}

// Image is an image record's fields that are kept as text.
type Image struct{ Config, CreatedAt string }

// EncodeImage is im's text fields.
func EncodeImage(im *store.Image) (Image, error) {
	var c Image
	var err error
	if c.CreatedAt, err = FormatTime(im.CreatedAt); err != nil {
		return c, fmt.Errorf("encoding created_at: %w", err)
	}
	if c.Config, err = marshal(im.Config); err != nil {
		return c, fmt.Errorf("encoding config: %w", err)
	}
	return c, nil
}

// Decode sets im's text fields from c; im.ID names the record in errors.
func (c Image) Decode(im *store.Image) error {
	if err := json.Unmarshal([]byte(c.Config), &im.Config); err != nil {
		return fmt.Errorf("decoding config of image %s: %w", im.ID, err)
	}
	var err error
	if im.CreatedAt, err = ParseTime(c.CreatedAt); err != nil {
		return fmt.Errorf("decoding created_at of image %s: %w", im.ID, err)
	}
	return nil
}

// Secret is a sealed record's fields that are kept as text: its times.
type Secret struct{ CreatedAt, UpdatedAt string }

// EncodeSecret is sec's text fields. Its error is FormatTime's as it is,
// which the stores wrap with the secret's name.
func EncodeSecret(sec *store.Secret) (Secret, error) {
	var c Secret
	var err error
	if c.CreatedAt, err = FormatTime(sec.CreatedAt); err != nil {
		return c, err
	}
	if c.UpdatedAt, err = FormatTime(sec.UpdatedAt); err != nil {
		return c, err
	}
	return c, nil
}

// Decode sets sec's times from c; sec.Name names the record in errors.
func (c Secret) Decode(sec *store.Secret) error {
	var err error
	if sec.CreatedAt, err = ParseTime(c.CreatedAt); err != nil {
		return fmt.Errorf("decoding created_at of secret %s: %w", sec.Name, err)
	}
	if sec.UpdatedAt, err = ParseTime(c.UpdatedAt); err != nil {
		return fmt.Errorf("decoding updated_at of secret %s: %w", sec.Name, err)
	}
	return nil
}

// AuditQuery is the query of the audit records f selects, oldest first,
// and its arguments; param(i) is the store's placeholder for the i-th
// argument, from 1 ("?" in SQLite, "$i" in PostgreSQL). Both stores run
// this one text, so they filter, order and page alike: by seq, the order
// the records were written, which since_seq pages on. Only the conditions
// f asks for are in it, so the planner sees plain ones it can serve from
// an index (audit_by_org, audit_by_time), not ones that test whether an
// argument was given.
func AuditQuery(f store.AuditFilter, param func(i int) string) (string, []any, error) {
	var where []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		where = append(where, cond+" "+param(len(args)))
	}
	if f.Org != "" {
		add("org =", f.Org)
	}
	if f.SinceSeq > 0 {
		add("seq >", f.SinceSeq)
	}
	if !f.Since.IsZero() {
		at, err := FormatTime(f.Since)
		if err != nil {
			return "", nil, err
		}
		add("time >=", at)
	}
	if f.Action != "" {
		add("action =", f.Action)
	}
	q := `SELECT ` + AuditNames + ` FROM audit`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY seq"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	return q, args, nil
}

// KeyNames are the columns of the api_keys table, in the order the stores
// read and write them.
const KeyNames = `id, org, name, scope, labels, hash, created_by, created_at, expires_at, last_used_at`

// Key is an API key record's fields that are kept as text.
type Key struct {
	Labels, CreatedAt string
	// ExpiresAt and LastUsedAt are nil (NULL) for a key that never
	// expires, and one never used.
	ExpiresAt, LastUsedAt *string
}

// EncodeKey is k's text fields, LastUsedAt aside: a key is stored unused
// (CreateKey), and its uses are recorded on their own (TouchKey). Labels
// nil are {}.
func EncodeKey(k *store.Key) (Key, error) {
	var c Key
	var err error
	if c.Labels, err = MarshalMap(k.Labels); err != nil {
		return c, fmt.Errorf("encoding labels: %w", err)
	}
	if c.CreatedAt, err = FormatTime(k.CreatedAt); err != nil {
		return c, fmt.Errorf("encoding created_at: %w", err)
	}
	if k.ExpiresAt != nil {
		expires, err := FormatTime(*k.ExpiresAt)
		if err != nil {
			return c, fmt.Errorf("encoding expires_at: %w", err)
		}
		c.ExpiresAt = &expires
	}
	return c, nil
}

// Decode sets k's text fields from c; k.ID names the record in errors.
func (c Key) Decode(k *store.Key) error {
	var err error
	if k.Labels, err = UnmarshalMap(c.Labels); err != nil {
		return fmt.Errorf("decoding labels of key %s: %w", k.ID, err)
	}
	if k.CreatedAt, err = ParseTime(c.CreatedAt); err != nil {
		return fmt.Errorf("decoding created_at of key %s: %w", k.ID, err)
	}
	if k.ExpiresAt, err = parseOptionalTime(c.ExpiresAt); err != nil {
		return fmt.Errorf("decoding expires_at of key %s: %w", k.ID, err)
	}
	if k.LastUsedAt, err = parseOptionalTime(c.LastUsedAt); err != nil {
		return fmt.Errorf("decoding last_used_at of key %s: %w", k.ID, err)
	}
	return nil
}

func parseOptionalTime(s *string) (*time.Time, error) {
	if s == nil {
		return nil, nil
	}
	t, err := ParseTime(*s)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// OrgNames are the columns of the orgs table, in the order the stores
// read and write them.
const OrgNames = `name, quota, created_at`

// Org is an org record's fields that are kept as text.
type Org struct{ Quota, CreatedAt string }

// EncodeOrg is o's text fields; an org with no quota has {}.
func EncodeOrg(o *store.Org) (Org, error) {
	var c Org
	var err error
	if c.Quota, err = MarshalQuota(o.Quota); err != nil {
		return c, err
	}
	if c.CreatedAt, err = FormatTime(o.CreatedAt); err != nil {
		return c, fmt.Errorf("encoding created_at: %w", err)
	}
	return c, nil
}

// MarshalQuota is q as its column: JSON, the limits that are set alone
// ({} for none).
func MarshalQuota(q api.Quota) (string, error) {
	s, err := marshal(q)
	if err != nil {
		return "", fmt.Errorf("encoding quota: %w", err)
	}
	return s, nil
}

// Decode sets o's text fields from c; o.Name names the record in errors.
func (c Org) Decode(o *store.Org) error {
	o.Quota = api.Quota{}
	if err := json.Unmarshal([]byte(c.Quota), &o.Quota); err != nil {
		return fmt.Errorf("decoding the quota of org %s: %w", o.Name, err)
	}
	var err error
	if o.CreatedAt, err = ParseTime(c.CreatedAt); err != nil {
		return fmt.Errorf("decoding created_at of org %s: %w", o.Name, err)
	}
	return nil
}

func marshal(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}
