// Package store keeps loam's metadata: sandboxes and checkpoints. The Store
// interface is what the rest of the daemon uses; store/sqlite is the embedded
// default, and store/storetest is the suite every implementation must pass.
package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"loam.dev/loam/api"
)

// Errors a Store returns, wrapped with context. Callers test them with errors.Is.
var (
	// ErrNotFound: no sandbox or checkpoint by that id or name.
	ErrNotFound = errors.New("not found")
	// ErrExists: the name (or id) is already in use.
	ErrExists = errors.New("already exists")
	// ErrNotEmpty: an org still owns something, so it is not deleted
	// (a *NotEmptyError says what).
	ErrNotEmpty = errors.New("not empty")
	// ErrStale: the record changed since the caller read it (an update
	// names the version it read; another writer's came first). Read it
	// again and decide anew.
	ErrStale = errors.New("changed since it was read")
)

// NotEmptyError is the ErrNotEmpty of an org that still has sandboxes or
// secrets.
type NotEmptyError struct{ Sandboxes, Secrets int }

func (e *NotEmptyError) Error() string {
	return fmt.Sprintf("%d sandboxes and %d secrets: %v", e.Sandboxes, e.Secrets, ErrNotEmpty)
}

// Is makes a NotEmptyError an ErrNotEmpty for errors.Is.
func (e *NotEmptyError) Is(target error) bool { return target == ErrNotEmpty }

// Sandbox is the stored record of a sandbox: what the API shows plus what
// only the daemon needs to drive it.
type Sandbox struct {
	api.Sandbox
	// NetIndex is the sandbox's slot in the private address range; unique
	// among live sandboxes.
	NetIndex int
	// AgentGen is the generation of the agent's token. The token itself is
	// never stored: the daemon derives it from its own secret, the
	// sandbox's id and this number, and bumps the number to rotate it.
	AgentGen int
	// LegacyAgentToken is the token, in clear, of a sandbox made by a loam
	// that stored tokens (schema version 1); "" for any other. It is used
	// once, to hand the agent a derived token, and then cleared.
	LegacyAgentToken string
	// RestoreTarget is the checkpoint a restore in progress (state
	// restoring) is putting the sandbox back to, so that a restarted daemon
	// can finish it. A running sandbox has one while the restore keeps its
	// state with the checkpoint that stops it, so that a restarted daemon
	// knows it may have stopped.
	RestoreTarget string
	// CheckpointSeq is the number of the last v-checkpoint taken (v1, v2, …);
	// it only grows, so ids are never reused.
	CheckpointSeq int
	// AutoSeq is the number of the last automatic checkpoint (auto-1, …).
	AutoSeq int
	// Error says why the sandbox is in state "error".
	Error string
	// Pool is, for a member of a warm pool, the pool it waits in (see
	// sandbox.Manager's pools); "" for every sandbox a user has. Members
	// are stored so that every step of making and deleting them is the
	// same as a sandbox's, but the API never shows them.
	Pool string
	// Org is the org that owns the sandbox, whose quota it counts against.
	Org string
	// Handover is the node a move hands the sandbox to (see
	// checkpoints.Service.Release), "" when none: calls to it wait for the
	// move's end, and that node alone may take it over (TakeOverSandbox)
	// while its owner still answers.
	Handover string
	// Version is the record's version: 1 when created, one more with
	// every update. UpdateSandbox applies a change only to the version it
	// was read at, so of two writers that read one version (two nodes,
	// two goroutines) only one's change lands; the other's answers
	// ErrStale. The store sets it; a caller keeps the record it updated
	// and updates it again without reading it.
	Version int64
}

// AnyNode is the Handover of a sandbox tied to no node (its Node ""): one
// asleep whose image is in the object store, let go by its node (a
// drain), which any node takes over when it is woken.
const AnyNode = "*"

// Checkpoint is the stored record of a checkpoint. Its data parts (memory
// image, disk snapshot) live on disk; the record is written only once they
// are durable, so a record always points at a whole checkpoint.
type Checkpoint struct {
	api.Checkpoint
	// SandboxName is the name of the sandbox when the checkpoint was taken.
	SandboxName string
	// Template, Image and Resources are the sandbox's at the time: a fork
	// takes them from here.
	Template  string
	Image     string
	Resources api.Resources
	// AgentGen is the generation of the token the agent held in the
	// checkpoint's memory (see Sandbox.AgentGen).
	AgentGen int
	// LegacyAgentToken is that token in clear for a checkpoint taken by a
	// loam that stored tokens (schema version 1); "" for any other.
	LegacyAgentToken string
}

// Secret is the stored record of a secret: its value sealed by
// internal/secret (AES-GCM), never in clear. Stores that keep secrets
// (store/sqlite) have PutSecret, GetSecret, ListSecrets and DeleteSecret;
// they are not part of Store, since only internal/secret uses them.
type Secret struct {
	// Org owns the secret; a name is unique within it.
	Org       string
	Name      string
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

// ConsoleSession is a web console login (internal/console), kept so that a
// restart of the daemon does not log its users out. Key is the sha256 of
// the session cookie's value, never the value itself, so that what is
// stored cannot be replayed. Stores that keep them (store/sqlite) have
// PutConsoleSession, GetConsoleSession, ListConsoleSessions and
// DeleteConsoleSessions; they
// are not part of Store, since only internal/console uses them.
type ConsoleSession struct {
	Key       string
	CSRFToken string
	ExpiresAt time.Time
	// Org and APIKey are whose session it is: the org and id of the key
	// that logged in (api.AdminKeyID for the admin token).
	Org, APIKey string
}

// Sealed is a table of sealed values by org and name (internal/secret
// seals and opens them): the secrets', or the registry credentials', which
// are kept apart so that they stay out of the secrets' listing.
type Sealed interface {
	PutSecret(ctx context.Context, sec *Secret) error
	GetSecret(ctx context.Context, org, name string) (*Secret, error)
	ListSecrets(ctx context.Context, org string) ([]*Secret, error)
	DeleteSecret(ctx context.Context, org, name string) error
}

// Filter narrows ListSandboxes. Every label given must match.
type Filter struct {
	// Org, when set, keeps only the sandboxes of that org.
	Org    string
	Labels map[string]string
	// Node, when set, keeps only the sandboxes that node owns (a cluster's
	// node acts on its own alone). One machine's sandboxes own no node.
	Node string
}

// UsersOf narrows ListSandboxes to the sandboxes that may use a template
// or an image of org, own being the daemon's org (loam serve --org): the
// org's own, or, for the daemon's org, every org's, since sandboxes of any
// org were made of its templates and images before those were each org's,
// and keep their names for them. A delete checks them for uses.
func UsersOf(org, own string) Filter {
	if org == own {
		return Filter{}
	}
	return Filter{Org: org}
}

// Store is the metadata store. Every method is safe for concurrent use.
// Where a method takes ref, ref is a sandbox's id or its name.
type Store interface {
	// CreateSandbox adds a sandbox, at Version 1 (which it sets). It fails
	// with ErrExists when the id is taken, or the name within the
	// sandbox's org.
	CreateSandbox(ctx context.Context, sb *Sandbox) error
	// GetSandbox finds a sandbox of org by id or name; ErrNotFound if none,
	// or if it belongs to another org. When ref is one sandbox's id and
	// another's name, the id wins. An org of "" finds a sandbox of any org:
	// the daemon's own lookups, by id.
	GetSandbox(ctx context.Context, org, ref string) (*Sandbox, error)
	// ListSandboxes lists sandboxes, oldest first.
	ListSandboxes(ctx context.Context, f Filter) ([]*Sandbox, error)
	// UpdateSandbox replaces the stored record with the same id, if it is
	// still at sb.Version, and sets sb.Version to the new version;
	// ErrNotFound if there is none, ErrStale if it has another version,
	// ErrExists if the new name is another sandbox's of its org. The
	// sandbox's checkpoints are kept.
	UpdateSandbox(ctx context.Context, sb *Sandbox) error
	// DeleteSandbox removes a sandbox and all its checkpoints; ErrNotFound if none.
	DeleteSandbox(ctx context.Context, id string) error
	// UsedNetIndexes returns the NetIndex of every sandbox node owns (of
	// every sandbox for ""): a node hands out addresses of its own subnet.
	UsedNetIndexes(ctx context.Context, node string) ([]int, error)

	// CreateCheckpoint adds a checkpoint to the sandbox whose id is
	// cp.Sandbox. ErrExists if the sandbox already has one with that id or
	// name (checkpoints without a name never conflict), ErrNotFound if there
	// is no such sandbox. The record is durable when it returns.
	CreateCheckpoint(ctx context.Context, cp *Checkpoint) error
	// GetCheckpoint finds a checkpoint of sandbox (an id) by its id or name;
	// ErrNotFound if none. When ref is one checkpoint's id and another's
	// name, the id wins.
	GetCheckpoint(ctx context.Context, sandboxID, ref string) (*Checkpoint, error)
	// ListCheckpoints lists a sandbox's checkpoints, oldest first (in the
	// order they were created); ErrNotFound if there is no such sandbox.
	ListCheckpoints(ctx context.Context, sandboxID string) ([]*Checkpoint, error)
	// DeleteCheckpoint removes one checkpoint, given by id; ErrNotFound if none.
	DeleteCheckpoint(ctx context.Context, sandboxID, id string) error
	// Close releases the store.
	Close() error
}

// Now is the store's clock, in UTC with the precision the API shows.
func Now() time.Time { return time.Now().UTC() }

// Image is the stored record of an image (internal/image). Stores that keep
// images (store/sqlite) have PutImage, GetImage, ListImages and DeleteImage;
// they are not part of Store, since only internal/image uses them.
type Image struct {
	api.Image
	// Org owns the image: it pulled it, with its registry credentials.
	// Ids and refs are unique within an org.
	Org string
	// Template is the disk template the image is unpacked into (named by
	// its digest, so images with one digest share it); "" until ready.
	Template string
	// UserMissing is true when the image names a user its /etc/passwd
	// lacks: sandboxes cannot be made from it.
	UserMissing bool
}

// Key is the stored record of an API key (internal/auth). Hash is the
// sha256 of the key's secret: the secret itself is never stored. Stores
// that keep keys (store/sqlite) have CreateKey, KeyByHash, ListKeys,
// DeleteKey and TouchKey; they are not part of Store, since only
// internal/auth uses them.
type Key struct {
	api.Key
	Hash []byte
}

// Node is the stored record of a node of a cluster (store/postgres keeps
// them): what it reported with its last lease, and the lease.
type Node struct {
	Name, Address string
	// Epoch counts the node's joins: each start of its daemon takes the
	// next, and a change the node makes to a record is applied only while
	// its epoch is the record's (see postgres.Store.SetFence), so a
	// process of an earlier join, cut off but running on, changes nothing.
	Epoch      int64
	Cordoned   bool
	Load       api.NodeLoad
	JoinedAt   time.Time
	RenewedAt  time.Time
	LeaseUntil time.Time
}

// State is the node's state at now, the database's time: ready while its
// lease runs, unreachable once it ran out.
func (n *Node) State(now time.Time) api.NodeState {
	if n.LeaseUntil.After(now) {
		return api.NodeReady
	}
	return api.NodeUnreachable
}

// Org is the stored record of an org: its name and quota. Stores that
// keep orgs (store/sqlite) have the methods of sandbox.OrgStore; they are
// not part of Store, since only the orgs' admission uses them.
type Org struct {
	Name      string
	Quota     api.Quota
	CreatedAt time.Time
}

// AuditFilter narrows ListAudit: events of Org ("" for all orgs) after
// SinceSeq and at or after Since, of Action when it is given, at most
// Limit of them (oldest first).
type AuditFilter struct {
	Org      string
	Since    time.Time
	SinceSeq int64
	Action   string
	Limit    int
}

// AuditCall is the audit record of one API call that may change something,
// carried in the call's context (WithAudit). A store that keeps the audit
// log writes the record in the same transaction as the call's first change
// (see Attach), so that a change in the store is never missing from the
// log; Finish writes it when the call changed nothing in the store (an
// exec, a file write), and sets its outcome.
type AuditCall struct {
	log AuditWriter

	mu sync.Mutex
	ev api.AuditEvent
	// seq is the record's once written; closed is set when the call has
	// ended, after which later writes of the call's goroutines (a boot
	// that goes on) record nothing more.
	seq    int64
	closed bool
}

// AuditWriter writes audit records on their own (store/sqlite is one).
type AuditWriter interface {
	// AppendAudit writes one record.
	AppendAudit(ctx context.Context, ev api.AuditEvent) error
	// SetAuditOutcome changes the outcome of record seq.
	SetAuditOutcome(ctx context.Context, seq int64, outcome string) error
}

// NewAuditCall starts the record of a call, which log writes if no change
// of the call does.
func NewAuditCall(ev api.AuditEvent, log AuditWriter) *AuditCall {
	return &AuditCall{ev: ev, log: log}
}

type auditKey struct{}

// WithAudit returns ctx carrying c.
func WithAudit(ctx context.Context, c *AuditCall) context.Context {
	return context.WithValue(ctx, auditKey{}, c)
}

// WithoutAudit returns ctx carrying no call record: for the writes of a
// call that are not its change (a checkpoint's id spent before the work),
// which must not write the call's record.
func WithoutAudit(ctx context.Context) context.Context {
	return context.WithValue(ctx, auditKey{}, (*AuditCall)(nil))
}

type heldAuditKey struct{}

// HoldAudit returns ctx whose writes carry no call record, holding the
// record for ReleaseAudit: for an operation made of several writes whose
// change is its last one (a create is stored creating, booted, then
// stored running; recovery deletes one a crash leaves creating), so that
// the record goes with the write after which the change stays, and a
// crash part-way leaves no record of a change that never was.
func HoldAudit(ctx context.Context) context.Context {
	c := AuditFrom(ctx)
	if c == nil {
		return ctx
	}
	return context.WithValue(WithoutAudit(ctx), heldAuditKey{}, c)
}

// ReleaseAudit returns ctx carrying the record HoldAudit held, for the
// write that makes the change; ctx itself when it holds none.
func ReleaseAudit(ctx context.Context) context.Context {
	if c, _ := ctx.Value(heldAuditKey{}).(*AuditCall); c != nil {
		return WithAudit(ctx, c)
	}
	return ctx
}

// AuditFrom is the call record ctx carries, or nil.
func AuditFrom(ctx context.Context) *AuditCall {
	c, _ := ctx.Value(auditKey{}).(*AuditCall)
	return c
}

// SetAction renames the call's action (a create that is a fork is
// "sandbox.fork"); SetTarget names what it acts on (a create's new
// sandbox). Both do nothing once the record is written, and on nil.
func (c *AuditCall) SetAction(action string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seq == 0 && !c.closed {
		c.ev.Action = action
	}
}

// SetTarget: see SetAction.
func (c *AuditCall) SetTarget(target string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seq == 0 && !c.closed {
		c.ev.Target = target
	}
}

// Attach runs write, a store's transaction that changes something, with
// the record to write in it when the call has not written one yet (nil
// otherwise). write returns the record's sequence number once it has
// committed, or 0 when it wrote no record (it changed nothing). The call's
// record is held while write runs, so two changes of one call never both
// write it.
func (c *AuditCall) Attach(write func(ev *api.AuditEvent) (int64, error)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seq != 0 || c.closed {
		_, err := write(nil)
		return err
	}
	ev := c.ev
	ev.Outcome = "ok"
	seq, err := write(&ev)
	if err == nil && seq != 0 {
		c.seq = seq
	}
	return err
}

// Outcome is the outcome an audit record gives a call that ended with
// err: "ok", or its API error code (internal for any other error).
func Outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return string(ae.Code)
	}
	return string(api.CodeInternal)
}

// Finish ends the call with its outcome ("ok" or an error code): it writes
// the record when no change of the call wrote it, or sets its outcome when
// one did and the call failed after it. Later changes of the call write
// no record, and later Finishes do nothing. Nil does nothing.
func (c *AuditCall) Finish(ctx context.Context, outcome string) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.seq != 0 {
		if outcome == "ok" {
			return nil
		}
		return c.log.SetAuditOutcome(ctx, c.seq, outcome)
	}
	ev := c.ev
	ev.Outcome = outcome
	return c.log.AppendAudit(ctx, ev)
}
