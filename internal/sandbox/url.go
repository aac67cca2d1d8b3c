package sandbox

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"net/netip"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// HoldLimit bounds how long HTTPTarget holds a request while its sandbox is
// being created or restored.
const HoldLimit = 60 * time.Second

// holdPoll is how often HTTPTarget looks again at a sandbox that is
// creating or restoring with no operation of this daemon to wait for (a
// restore that a restarted daemon is finishing).
const holdPoll = 50 * time.Millisecond

// Target is where the URL front door sends the HTTP requests of one
// sandbox, as HTTPTarget found it.
type Target struct {
	// ID and Name are the sandbox's; Org is the org that owns it.
	ID, Name, Org string
	// Addr is the sandbox's address and http_port, reached from the host
	// straight over its veth (the firewall lets the host's connections in).
	Addr netip.AddrPort
	// Public is the sandbox's "public": anyone may use its URL.
	Public bool
	// AccessToken opens the sandbox's URL when it is not public.
	AccessToken string
	// Labels are the sandbox's: an API key limited by labels opens the
	// URLs of the sandboxes that have them.
	Labels map[string]string
	// Epoch counts the creates and restores this daemon has begun on the
	// sandbox: a request that failed on one target may be sent again when
	// a newer target has a larger Epoch (the machine it was sent to has
	// been replaced).
	Epoch uint64
	// Held is true when HTTPTarget waited for a create or restore: the
	// request is one of a burst released at once onto a new machine.
	Held bool
}

// drainLimit bounds how long a restore or a sleep waits for the requests
// already passed on through the sandbox's URL to be answered before it
// replaces or stops the machine; a WebSocket or a long stream is cut then.
const drainLimit = 2 * time.Second

// drain waits, up to drainLimit, until nothing holds sandbox id active
// (see Active): the requests the URL front door passed on before the
// caller's operation began get their answers from the machine they went
// to. New requests wait for the operation (holdsURL) meanwhile.
func (m *Manager) drain(id string) {
	l := m.peek(id)
	if l == nil {
		return
	}
	quiet := l.quietOn()
	if quiet == nil {
		return
	}
	t := time.NewTimer(drainLimit)
	defer t.Stop()
	select {
	case <-quiet:
	case <-t.C:
	}
}

// HTTPTarget finds where to send an HTTP request for sandbox name of org (a
// name, never an id: URLs carry names, NAME--ORG). While the sandbox is being created or
// restored it waits, up to HoldLimit or ctx's end, so that a request sent
// during a restore is answered by the restored machine, never refused.
//
// A sleeping sandbox is woken first (Use), and every request counts as
// activity for its idle time.
//
// admit, when not nil, is asked once, before any wait or wake, with the
// sandbox's ID, Name, Public and AccessToken: its error is returned as it
// is, so a request that may not use the URL neither waits nor wakes the
// sandbox.
//
// Errors: not_found for no such sandbox; unavailable for a sandbox in any
// other state but running, or still busy after HoldLimit; a wake's error;
// admit's.
func (m *Manager) HTTPTarget(ctx context.Context, org, name string, admit func(Target) error) (Target, error) {
	if org == "" {
		org = m.cfg.Org
	}
	ctx, cancel := context.WithTimeout(ctx, HoldLimit)
	defer cancel()
	held := false
	for {
		sb, err := m.store.GetSandbox(ctx, org, name)
		if errors.Is(err, store.ErrNotFound) || err == nil && (sb.Name != name || sb.Pool != "") {
			return Target{}, api.Errorf(api.CodeNotFound, "sandbox %q not found", name)
		}
		if err != nil {
			if ctx.Err() != nil {
				return Target{}, m.holdExpired(ctx, name)
			}
			return Target{}, err
		}
		if sb.Node != m.cfg.Node {
			// Its owner serves it (the front door passes requests there);
			// one that reaches this node finds it stopped answering.
			if since, lapsed := m.owner.lapsed(sb); lapsed {
				return Target{}, api.Errorf(api.CodeUnavailable, "sandbox %s is on node %s, which stopped answering at %s", name, sb.Node, since.UTC().Format(time.RFC3339))
			}
			return Target{}, &Elsewhere{Node: sb.Node, err: api.Errorf(api.CodeUnavailable, "sandbox %s is on node %s", name, sb.Node)}
		}
		if admit != nil {
			if err := admit(Target{ID: sb.ID, Name: sb.Name, Org: sb.Org, Public: sb.Public, AccessToken: AccessToken(m.cfg.Secret, sb.ID), Labels: maps.Clone(sb.Labels)}); err != nil {
				return Target{}, err
			}
			admit = nil
		}
		var (
			op    operation
			done  chan struct{}
			epoch uint64
		)
		l := m.peek(sb.ID)
		if l != nil {
			l.mu.Lock()
			op, done, epoch = l.op, l.opDone, l.epoch
			l.mu.Unlock()
		}
		// A move hands it to another node: held until it is that node's
		// (Elsewhere then says which), as during a restore.
		moving := sb.Handover != "" && sb.Handover != store.AnyNode
		if op.holdsURL() || sb.State == api.StateCreating || sb.State == api.StateRestoring || moving {
			var poll <-chan time.Time
			if !op.holdsURL() {
				done, poll = nil, time.After(holdPoll)
			}
			held = true
			if done != nil {
				if l.waitOp(ctx, done) != nil {
					return Target{}, m.holdExpired(ctx, name)
				}
				continue
			}
			select {
			case <-poll:
			case <-ctx.Done():
				return Target{}, m.holdExpired(ctx, name)
			}
			continue
		}
		switch sb.State {
		case api.StateRunning:
			m.touch(sb.ID) // a request through the URL is activity
		case api.StateSleeping:
			// A request wakes its sandbox and is then answered.
			if _, err := m.Use(ctx, sb.ID); err != nil {
				return Target{}, err
			}
			held = true
			continue
		default:
			return Target{}, api.Errorf(api.CodeUnavailable, "sandbox %s is %s", name, sb.State)
		}
		ep, err := m.Endpoint(sb)
		if err != nil {
			return Target{}, err
		}
		return Target{
			ID: sb.ID, Name: sb.Name, Org: sb.Org,
			Addr:        netip.AddrPortFrom(ep.SandboxIP, uint16(sb.HTTPPort)),
			Public:      sb.Public,
			Labels:      maps.Clone(sb.Labels),
			AccessToken: AccessToken(m.cfg.Secret, sb.ID),
			Epoch:       epoch,
			Held:        held,
		}, nil
	}
}

// Elsewhere is HTTPTarget's error for a sandbox another node owns (one
// that moved there while the request was on its way): the front door may
// pass the request on to that node (proxy.Config.Reforward).
type Elsewhere struct {
	Node string
	err  error
}

func (e *Elsewhere) Error() string { return e.err.Error() }

// Unwrap is the API's error (unavailable, naming the node).
func (e *Elsewhere) Unwrap() error { return e.err }

// holdExpired is HTTPTarget's error when it waited as long as it may.
func (m *Manager) holdExpired(ctx context.Context, name string) error {
	if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return api.Errorf(api.CodeUnavailable, "sandbox %s is still being created or restored after %s", name, HoldLimit)
	}
	return ctx.Err()
}

// AccessToken is the token that opens the URL of private sandbox id,
// derived from the daemon's secret, so it needs no storing and lasts as
// long as the sandbox.
func AccessToken(secret []byte, id string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("loam access token\x00" + id))
	return "loam_at_" + hex.EncodeToString(mac.Sum(nil))[:40]
}

// AccessToken returns a sandbox's URL and the token that opens it. It is
// for the sandbox's owner only: the in-sandbox API does not offer it.
func (m *Manager) AccessToken(ctx context.Context, ref string) (*api.AccessToken, error) {
	sb, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	return &api.AccessToken{URL: m.URL(sb.Org, sb.Name), AccessToken: AccessToken(m.cfg.Secret, sb.ID)}, nil
}
