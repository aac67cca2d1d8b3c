package sandbox

import (
	"context"
	"sync"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// The concurrency protocol of a sandbox.
//
// What the daemon knows of a sandbox only while it runs (the operation on
// it, the calls it holds back, its streams and calls in flight, the watch
// on its sandbox process, its last use, its agent's version) is one live
// object, with a lock of its own: calls to two sandboxes never wait for
// each other. The Manager's lock guards only the registry that finds a
// sandbox's live object by id. Its spare exec sockets are kept with the
// connections to agents (agentconn.Conns), under their own lock.
//
// Waiting is done on channels a live object closes when what is waited
// for happens: an operation's end (opDone), a hold's release (held), the
// last active request's end (quiet). Where a caller must tell whether
// something happened while it read the sandbox's record (an operation
// ended, calls were held), it notes the time before the read and asks the
// live object whether it changed since (endedSince, heldSinceLocked).

// operation is an operation that runs on one sandbox at a time (begin). Its
// String is how the API's conflict names it ("sandbox x is busy: a
// restore is in progress"): never change one.
type operation int

// The operations. opNone is no operation.
const (
	opNone operation = iota
	opCreate
	opDelete
	opCheckpoint
	opCheckpointDelete
	opRestore
	opBoot
	opSleep
	opWake
	opUpdate
	opNetwork
	opDeath
	opRecover
	opMove
)

var opNames = [...]string{
	opNone:             "",
	opCreate:           "create",
	opDelete:           "delete",
	opCheckpoint:       "a checkpoint",
	opCheckpointDelete: "a checkpoint delete",
	opRestore:          "a restore",
	opBoot:             "a boot",
	opSleep:            "a sleep",
	opWake:             "a wake",
	opUpdate:           "an update",
	opNetwork:          "network change",
	opDeath:            "a check of its sandbox process",
	opRecover:          "a recovery",
	opMove:             "a move to another node",
}

// String is the operation as a user reads it in a conflict.
func (o operation) String() string {
	if o < 0 || int(o) >= len(opNames) {
		return "an operation"
	}
	return opNames[o]
}

// holdsURL tells whether the operation makes the URL front door wait for
// its end: one that replaces the machine behind it, or puts it to sleep
// (the request then wakes it).
func (o operation) holdsURL() bool {
	return o == opRestore || o == opCreate || o == opSleep || o == opMove
}

// live is what the daemon knows of one sandbox while it runs, under its
// own lock (see the protocol above).
type live struct {
	id string

	mu sync.Mutex
	// op is the operation running on the sandbox, opDone closed when it
	// ends (nil while none runs); lastEnd is when the last one ended.
	op      operation
	opDone  chan struct{}
	lastEnd time.Time
	// waiters counts the calls waiting for op's end or a wake (waitOp):
	// for tests, which must know a call waits before they let it go on.
	waiters int
	// epoch counts the operations begun that hold the sandbox's URL (see
	// Target.Epoch).
	epoch uint64
	// held is closed when the calls held by a memory checkpoint go on (see
	// holdCalls), nil when none are held; heldAt is when a hold last
	// began or ended.
	held   chan struct{}
	heldAt time.Time
	// streams and calls are the streams and the relayed calls open on
	// the sandbox (stream.go, relay.go).
	streams map[*Stream]bool
	calls   map[*relayCall]bool
	// used is when the sandbox was last used (zero: not known yet);
	// holds counts the Actives open on it, and quiet is closed when they
	// drop to none (nil while there are none: see drain).
	used  time.Time
	holds int
	quiet chan struct{}
	// death watches the sandbox's sandbox process (death.go).
	death *deathWatch
	// waking is the wake in progress, that concurrent callers wait for.
	waking *wakeCall
	// agentVersion is the protocol version of the sandbox's agent as its
	// last connect found it, 0 before one.
	agentVersion int
	// source orders the sandbox's checkpoints: held for writing to delete
	// or prune them, for reading while a fork reads one (lockSource).
	source sync.RWMutex
}

// live finds the live object of sandbox id, making it if there is none.
func (m *Manager) live(id string) *live {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.lives[id]
	if l == nil {
		if m.lives == nil {
			m.lives = map[string]*live{}
		}
		l = &live{id: id}
		m.lives[id] = l
	}
	return l
}

// peek finds the live object of sandbox id, nil when there is none: for
// the reads that must not make one for a sandbox already forgotten.
func (m *Manager) peek(id string) *live {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lives[id]
}

// forgetLive drops sandbox id's live object, so that the registry does not
// grow with every sandbox ever made. Who still holds it (a fork waiting on
// its source lock, the deleting operation) finds the sandbox gone.
func (m *Manager) forgetLive(id string) {
	m.mu.Lock()
	delete(m.lives, id)
	m.mu.Unlock()
	m.conns.Forget(id)
}

// begin marks an operation as running on a sandbox, or refuses with a
// conflict when another one is. The returned func ends it.
func (m *Manager) begin(sb *store.Sandbox, what operation) (func(), error) {
	l := m.live(sb.ID)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.op != opNone {
		return nil, api.Errorf(api.CodeConflict, "sandbox %s is busy: %s is in progress", sb.Name, l.op)
	}
	l.op = what
	done := make(chan struct{})
	l.opDone = done
	if what.holdsURL() {
		l.epoch++
	}
	return func() {
		l.mu.Lock()
		l.op, l.opDone = opNone, nil
		l.lastEnd = time.Now()
		close(done)
		l.mu.Unlock()
	}, nil
}

// current is the operation running on the sandbox and the channel closed
// when it ends (nil for none).
func (l *live) current() (operation, chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.op, l.opDone
}

// endedSince reports whether an operation ended at or after t.
func (l *live) endedSince(t time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lastEnd.IsZero() && !l.lastEnd.Before(t)
}

// waitFree waits until no operation runs on the sandbox.
func (l *live) waitFree() {
	for {
		_, done := l.current()
		if done == nil {
			return
		}
		<-done
	}
}

// heldOn is the channel that closes when the sandbox's held calls go on,
// nil when they are not held.
func (l *live) heldOn() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// touch marks the sandbox as used at now.
func (l *live) touch(now time.Time) {
	l.mu.Lock()
	l.used = now
	l.mu.Unlock()
}

// activate counts one more Active on the sandbox; the func returned ends
// it, once.
func (l *live) activate() (release func()) {
	l.mu.Lock()
	if l.holds == 0 {
		l.quiet = make(chan struct{})
	}
	l.holds++
	l.used = time.Now()
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.holds--; l.holds == 0 {
				close(l.quiet)
				l.quiet = nil
			}
			l.used = time.Now()
		})
	}
}

// quietOn is the channel closed when no Active is left on the sandbox, nil
// when there is none now.
func (l *live) quietOn() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.quiet
}

// waitOp waits for the sandbox's operation that done belongs to, or
// ctx's end.
func (l *live) waitOp(ctx context.Context, done <-chan struct{}) error {
	if done == nil {
		return nil
	}
	l.mu.Lock()
	l.waiters++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.waiters--
		l.mu.Unlock()
	}()
	return waitOp(ctx, done)
}

// waitOp waits until done is closed, or ctx's end.
func waitOp(ctx context.Context, done <-chan struct{}) error {
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wakeCall is one wake in progress.
type wakeCall struct {
	done chan struct{}
	err  error
}

// wake runs do, the sandbox's wake, unless one runs already: then it waits
// for that one's end (or ctx's) and returns its error. The caller that
// runs do waits for it whatever ctx does.
func (l *live) wake(ctx context.Context, do func() error) error {
	l.mu.Lock()
	w := l.waking
	leader := w == nil
	if leader {
		w = &wakeCall{done: make(chan struct{})}
		l.waking = w
	}
	l.mu.Unlock()
	if leader {
		w.err = do()
		l.mu.Lock()
		l.waking = nil
		l.mu.Unlock()
		close(w.done)
		return w.err
	}
	if err := l.waitOp(ctx, w.done); err != nil {
		return err
	}
	return w.err
}

// Close ends the goroutines the Manager runs on its own and waits for
// them: the spare exec sockets being opened (and those kept are closed)
// and the watches on sandbox processes (a death that comes after is
// judged by the next daemon's Recover). It leaves the sandboxes running,
// and the warm pools to their Run. Call it once requests have stopped.
func (m *Manager) Close() error {
	m.deaths.close()
	// The spare dials and the idle connections' goroutines.
	return m.conns.Close()
}
