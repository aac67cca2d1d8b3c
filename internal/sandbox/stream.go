package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Stream is one open WebSocket into a sandbox's agent (an exec socket; later
// attach sockets, port streams and watches), handed to the caller to proxy
// to its client: the Manager never holds a client's socket. The Manager
// ends every stream of a sandbox before a memory checkpoint or a restore:
// it closes the agent's side, and Ended is closed with Reason saying why;
// the caller then closes its client's socket with status 1011. The caller
// calls Close when it is done, whichever side ended first.
//
// A Stream with no socket (agent nil, see Call.Stream) stands for a call
// in flight that must end as streams do: a session's wait.
type Stream struct {
	agent  *websocket.Conn
	ctx    context.Context
	cancel context.CancelCauseFunc
	// fromAgent rewrites each text message from the agent before the
	// client sees it, or drops it (returns nil); nil passes them on as
	// they are.
	fromAgent func([]byte) []byte
	release   func() // unregisters the stream from its sandbox
	// died reports whether the sandbox's process has died (death.go);
	// nil for a stream of no sandbox.
	died   func() bool
	once   sync.Once
	closed chan struct{}
}

// streamCloseWait bounds how long ending a stream waits for its caller to
// close the client's socket.
const streamCloseWait = 5 * time.Second

func newStream(agent *websocket.Conn, fromAgent func([]byte) []byte) *Stream {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Stream{agent: agent, ctx: ctx, cancel: cancel, fromAgent: fromAgent, closed: make(chan struct{})}
}

// NewStream makes a Stream over a socket to an agent that no sandbox ends,
// for tests of code that proxies streams.
func NewStream(agent *websocket.Conn) *Stream { return newStream(agent, nil) }

// Agent is the socket to the sandbox's agent.
func (s *Stream) Agent() *websocket.Conn { return s.agent }

// FromAgent is what the client should get for a text message the agent
// sent: the message itself, or, where the agent said more than it may (see
// agentconn.Control), what loam says instead; nil when the client should get
// nothing.
func (s *Stream) FromAgent(data []byte) []byte {
	if s.fromAgent == nil {
		return data
	}
	return s.fromAgent(data)
}

// Ended is closed when the Manager ends the stream.
func (s *Stream) Ended() <-chan struct{} { return s.ctx.Done() }

// Reason says why the Manager ended the stream; "" while it has not.
func (s *Stream) Reason() string {
	if s.ctx.Err() == nil {
		return ""
	}
	return context.Cause(s.ctx).Error()
}

// Broke is for the caller whose socket to the agent failed before the
// Manager ended the stream: when that is because the sandbox's process
// died (its sockets go with it, a moment before the daemon learns why),
// it waits, a while, for the Manager to end the stream, so that Reason
// says what happened. Otherwise it returns at once.
func (s *Stream) Broke() {
	if s.died == nil || s.ctx.Err() != nil || !s.died() {
		return
	}
	select {
	case <-s.ctx.Done():
	case <-time.After(streamCloseWait):
	}
}

// end is the Manager's side: it closes the agent's socket and tells the
// caller why, then waits (a while) for the caller to close its client's.
func (s *Stream) end(reason string) {
	s.cancel(errors.New(reason))
	if s.agent != nil {
		s.agent.CloseNow()
	}
	select {
	case <-s.closed:
	case <-time.After(streamCloseWait):
	}
}

// Close releases the stream and closes the agent's socket. It is safe to
// call more than once.
func (s *Stream) Close() {
	s.once.Do(func() {
		s.cancel(nil)
		if s.agent != nil {
			s.agent.CloseNow()
		}
		if s.release != nil {
			s.release()
		}
		close(s.closed)
	})
}

// Context is the stream's context: it ends when the Manager ends the
// stream (its cause says why) or the stream is closed.
func (s *Stream) Context() context.Context { return s.ctx }

// addStream registers s as a stream of sandbox id, until s is closed.
func (m *Manager) addStream(id string, s *Stream) {
	l := m.live(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streams == nil {
		l.streams = map[*Stream]bool{}
	}
	l.streams[s] = true
	s.release = func() { l.removeStream(s) }
	s.died = func() bool { return l.died() }
}

func (l *live) removeStream(s *Stream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.streams, s)
	l.used = time.Now() // idle time starts when the stream ends
}

// closeStreams ends every stream of a sandbox with status 1011, cuts its
// calls in flight that a checkpoint cuts, and closes its spare exec
// sockets.
func (m *Manager) closeStreams(id, reason string) {
	m.agents.dropSpare(id)
	m.endCalls(id, reason)
	l := m.peek(id)
	if l == nil {
		return
	}
	l.mu.Lock()
	ss := make([]*Stream, 0, len(l.streams))
	for s := range l.streams {
		ss = append(ss, s)
	}
	l.mu.Unlock()
	// Each end waits for its client's socket to be closed (a few seconds
	// for a client that does not read): end them all at once.
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(func() { s.end(reason) })
	}
	wg.Wait()
}
