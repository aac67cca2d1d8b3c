package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/checkpoint"
	"loam.dev/loam/internal/store"
)

// Waking anywhere.
//
// In a cluster with an object store, a sandbox's sleep image is stored
// once it sleeps (SleepStore), so that it does not pin its node: when its
// node stops answering, or let it go (a drain unpins it: store.AnyNode,
// tied to no node), the first call on any node that needs it running (or
// any other operation on it) takes it over there, asleep, from that image
// (adopt), and the call goes on as on a sandbox of the node's own: the
// wake restores it, with the same id, name and URL, and nothing lost.
// The database decides which node takes it (Takeover.TakeOverSleeping),
// and only from the image of the token generation the record says: one a
// wake has left behind is never used. The node it slept on, if it comes
// back, finds the record another's and destroys its stale copy
// (DropStale).

// SleepStore keeps sleep images in the object store (checkpoints.Uploader
// has it).
type SleepStore interface {
	// QueueSleep stores the image of sandbox id, just asleep, in the
	// background.
	QueueSleep(id string)
	// ForgetSleep drops sandbox id's stored image as it wakes (and its
	// upload, if under way).
	ForgetSleep(id string)
	// WaitSleep returns once sandbox id's image is stored (queued first
	// if it is not), or ctx ends.
	WaitSleep(ctx context.Context, id string) error
	// FetchSleep fetches sleeping sandbox sb's stored image, of the
	// generation its record says, into dest: its disk as it slept and
	// its memory image, checked whole.
	FetchSleep(ctx context.Context, sb *store.Sandbox, dest string) (diskDir, memDir string, err error)
}

// unpinned tells whether sb is tied to no node: asleep, its image stored,
// let go by its node (Unpin).
func unpinned(sb *store.Sandbox) bool {
	return sb.Node == "" && sb.Handover == store.AnyNode
}

// adoptable tells whether this node may take sb over to wake it here from
// its stored sleep image: asleep, and its node stopped answering, or it is
// tied to none.
func adoptable(m *Manager, sb *store.Sandbox) bool {
	if m.cfg.SleepStore == nil || m.cfg.Takeover == nil || m.cfg.FrontEnd || m.cfg.Node == "" ||
		sb.State != api.StateSleeping || sb.Pool != "" || sb.Node == m.cfg.Node {
		return false
	}
	if unpinned(sb) {
		return true
	}
	_, lapsed := m.owner.lapsed(sb)
	return lapsed
}

// lookupAdopt is lookupOwn for the calls that act on a sandbox: one that
// sleeps on a node that stopped answering, or on none, is taken over here
// first (adopt), and then found this node's.
func lookupAdopt(ctx context.Context, m *Manager, ref string) (*store.Sandbox, error) {
	sb, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if m.owner.refuse(sb) == nil || !adoptable(m, sb) {
		return lookupOwn(ctx, m, ref)
	}
	if err := adopt(ctx, m, sb); err != nil {
		return nil, err
	}
	return lookupOwn(ctx, m, sb.ID)
}

// adoptions keeps one adoption of a sandbox at a time on this node.
type adoptions struct {
	mu sync.Mutex
	by map[string]*sync.Mutex
}

func (a *adoptions) lock(id string) func() {
	a.mu.Lock()
	if a.by == nil {
		a.by = map[string]*sync.Mutex{}
	}
	l, ok := a.by[id]
	if !ok {
		l = &sync.Mutex{}
		a.by[id] = l
	}
	a.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		a.mu.Lock()
		delete(a.by, id)
		a.mu.Unlock()
	}
}

// adopt takes sleeping sandbox sb over to this node from its stored sleep
// image, asleep: the image fetched first (one not stored, or that would
// not restore here, leaves the sandbox where it was), its disk imported
// into the pool, then the record moved here in one step the database
// decides, then the disk and the image put in place as this node's own
// sleeping sandbox's. The caller then wakes it as any other.
func adopt(ctx context.Context, m *Manager, sb *store.Sandbox) error {
	defer m.adopting.lock(sb.ID)()
	fresh, err := m.lookup(ctx, sb.ID)
	if err != nil {
		return err
	}
	if fresh.Node == m.cfg.Node {
		return nil // taken over meanwhile, by another call
	}
	if !adoptable(m, fresh) {
		return m.owner.refuse(fresh)
	}
	sb = fresh
	leave, err := m.heavy.enter(ctx, "waking "+sb.Name)
	if err != nil {
		return err
	}
	defer leave()
	// Refused before anything is fetched when the org, or this node, has
	// no room for it to run (the wake asks again).
	admitted, err := m.admit.start(ctx, sb)
	if err != nil {
		return err
	}
	admitted()
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	snap, memDir, done, err := fetchSleep(ctx, m, sb)
	if err != nil {
		return err
	}
	defer done()
	fetched := time.Since(start)
	from := sb.Node
	got, err := takeOverSleeping(ctx, m, sb)
	if err != nil {
		return err
	}
	if err := installSleep(ctx, m, got, snap, memDir); err != nil {
		_ = m.setState(ctx, got, api.StateError, fmt.Sprintf("taken over by node %s to wake it from its stored sleep image, which failed: %v", m.cfg.Node, err))
		return publicError(fmt.Errorf("waking %s on node %s: %w", got.Name, m.cfg.Node, err))
	}
	m.log.Info("took over a sleeping sandbox to wake it here", "sandbox", got.ID, "name", got.Name, "from_node", from,
		"fetch_ms", fetched.Milliseconds(), "ms", time.Since(start).Milliseconds())
	return nil
}

// fetchSleep fetches sleeping sandbox sb's stored image, checked whole:
// its disk into snapshot snap of the pool, its memory image into memDir;
// done removes both (once installSleep has made them the sandbox's). The
// disk goes in as a snapshot of no checkpoint's (the recovery's sweep
// removes one a crash leaves), to be cloned once the sandbox is this
// node's: nothing under the sandbox's own name is made before, which the
// stale copies' sweep would take for a stale copy.
func fetchSleep(ctx context.Context, m *Manager, sb *store.Sandbox) (snap, memDir string, done func(), err error) {
	work := filepath.Join(m.cfg.DataDir, "fetch")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return "", "", nil, err
	}
	staging, err := os.MkdirTemp(work, sb.ID+".sleep.")
	if err != nil {
		return "", "", nil, err
	}
	diskDir, memDir, err := m.cfg.SleepStore.FetchSleep(ctx, sb, staging)
	if err != nil {
		os.RemoveAll(staging)
		return "", "", nil, err
	}
	snap = checkpoint.Snapshot(sb.ID, "adopting")
	_ = m.disks.DeleteSnapshot(ctx, snap)
	if err := m.disks.ImportSnapshot(ctx, snap, diskDir); err != nil {
		os.RemoveAll(staging)
		return "", "", nil, fmt.Errorf("waking %s here: its disk: %w", sb.Name, err)
	}
	return snap, memDir, func() {
		_ = m.disks.DeleteSnapshot(ctx, snap)
		os.RemoveAll(staging)
	}, nil
}

// installSleep makes disk snapshot snap and memory image memDir (of
// fetchSleep) sandbox sb's, this node's and asleep: its volume and its
// sleep image of the generation its record says. On failure it removes
// what it made.
func installSleep(ctx context.Context, m *Manager, sb *store.Sandbox, snap, memDir string) error {
	fail := func(err error) error {
		_ = m.disks.DeleteVolume(ctx, sb.ID)
		_ = m.sleepImages.Drop(sb.ID)
		return err
	}
	_ = m.disks.DeleteVolume(ctx, sb.ID) // what a crash left
	if _, err := m.disks.CloneSnapshot(ctx, snap, sb.ID); err != nil {
		return fail(fmt.Errorf("its disk: %w", err))
	}
	img, err := m.sleepImages.Begin(sb.ID)
	if err != nil {
		return fail(err)
	}
	if err := os.Rename(memDir, img); err != nil {
		return fail(fmt.Errorf("its memory image: %w", err))
	}
	if err := m.sleepImages.Commit(sb.ID, img, sb.AgentGen); err != nil {
		return fail(err)
	}
	return nil
}

// refetchSleep puts back this node's sleeping sandbox sb from its stored
// sleep image, when its own image is gone: a crash after a takeover
// (adopt) and before the image was in place leaves the record this
// node's, and the image only in the store.
func refetchSleep(ctx context.Context, m *Manager, sb *store.Sandbox) error {
	if m.cfg.SleepStore == nil {
		return errors.New("no sleep images are stored")
	}
	snap, memDir, done, err := fetchSleep(ctx, m, sb)
	if err != nil {
		return err
	}
	defer done()
	return installSleep(ctx, m, sb, snap, memDir)
}

// takeOverSleeping moves sleeping sandbox sb's record to this node (see
// Takeover.TakeOverSleeping), with a network slot of this node's range.
func takeOverSleeping(ctx context.Context, m *Manager, sb *store.Sandbox) (*store.Sandbox, error) {
	got, err := inNewSlot(ctx, m, func(idx int) (*store.Sandbox, error) {
		return m.cfg.Takeover.TakeOverSleeping(ctx, sb.ID, sb.Node, m.cfg.Node, idx, sb.AgentGen)
	})
	if errors.Is(err, store.ErrStale) {
		return nil, api.Errorf(api.CodeConflict, "sandbox %s was woken or taken over meanwhile (by its node or another): try again", sb.Name)
	}
	return got, err
}

// Unpin lets sleeping sandbox ref, this node's, go: once its sleep image
// is stored, its record is tied to no node (store.AnyNode) and this
// node's copy goes (its disk and image; the stored checkpoints stay). The
// next call that needs it running, on any node, wakes it there. A drain
// does this to the sleeping sandboxes of the node it empties.
func (c *CheckpointCore) Unpin(ctx context.Context, ref string) (*store.Sandbox, error) {
	m := c.m
	if m.cfg.SleepStore == nil || m.cfg.Node == "" {
		return nil, api.Errorf(api.CodeUnavailable, "this node does not store sleep images (loam serve --objects, in a cluster)")
	}
	sb, end, err := m.claim(ctx, ref, opMove)
	if err != nil {
		return nil, err
	}
	defer end()
	ctx = context.WithoutCancel(ctx)
	if err := requireState(sb.Name, sb.State, api.StateSleeping); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, unpinWait)
	err = m.cfg.SleepStore.WaitSleep(wctx, sb.ID)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("storing the sleep image of %s: %w", sb.Name, err)
	}
	from := sb.Node
	sb.Node, sb.Handover = "", store.AnyNode
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return nil, fmt.Errorf("letting %s go: %w", sb.Name, err)
	}
	if err := c.dropLocal(ctx, sb.ID, false); err != nil {
		m.log.Warn("removing the copy of a sleeping sandbox let go", "sandbox", sb.ID, "err", err)
	}
	m.log.Info("let a sleeping sandbox go: it wakes on any node", "sandbox", sb.ID, "name", sb.Name, "from_node", from)
	return sb, nil
}

// unpinWait bounds how long Unpin waits for a sleep image to be stored.
const unpinWait = 10 * time.Minute
