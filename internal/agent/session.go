package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/proc"
)

// sessions is the agent's registry of exec sessions (see api/session.go).
// Every exec is a session; a detachable one owns its process's stdio and
// keeps its output in rings for any number of clients to attach to, while a
// non-detachable one is served by the exec socket that started it (see
// execSocket) and is registered only to be listed, waited for, signalled and
// killed. The registry holds every running session and the newest
// api.MaxExitedSessions exited ones; nothing ends a session on a timer.
type sessions struct {
	log    *slog.Logger
	reaper *proc.Reaper

	mu   sync.Mutex
	byID map[string]*session
	list []*session // in order of start
}

func newSessions(log *slog.Logger, r *proc.Reaper) *sessions {
	return &sessions{log: log, reaper: r, byID: map[string]*session{}}
}

// session is one command of the registry.
type session struct {
	id         string
	cmd        []string
	tty        bool
	detachable bool
	started    time.Time
	proc       *proc.Process
	reaper     *proc.Reaper
	log        *slog.Logger

	// done is closed once the session has exited and, when detachable,
	// all its output is in its rings; code and exited are set before.
	done   chan struct{}
	code   int
	exited time.Time

	// Detachable sessions only.
	sio  *stdio
	outs []sessionOutput
	// stdinQ carries attached clients' stdin to writeStdin; nil when the
	// command takes none. stdinMu guards sending on it and closing it.
	stdinMu  sync.Mutex
	stdinQ   chan []byte
	stdinEOF bool
}

// sessionOutput is one output stream of a detachable session.
type sessionOutput struct {
	stream byte
	f      *os.File // the parent's end of the pipe or terminal
	ring   *proc.Ring
}

// newSessionID makes an id "s-" and 12 letters and digits.
func newSessionID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "s-" + string(b)
}

// add registers a started process as a session. For a detachable one, sio
// is its stdio, which the session owns from here on; nil otherwise.
func (r *sessions) add(p *proc.Process, c *command, detachable bool, sio *stdio) *session {
	ss := &session{
		id:         newSessionID(),
		cmd:        slices.Clone(c.argv),
		tty:        c.tty,
		detachable: detachable,
		started:    time.Now().UTC(),
		proc:       p,
		reaper:     r.reaper,
		done:       make(chan struct{}),
		sio:        sio,
	}
	ss.log = r.log.With("session", ss.id, "pid", p.PID(), "cmd", c.argv[0], "user", c.user)
	r.mu.Lock()
	r.byID[ss.id] = ss
	r.list = append(r.list, ss)
	r.mu.Unlock()
	return ss
}

// start starts c as a detachable session, with output buffers of
// req.BufferSize bytes per stream.
func (r *sessions) start(h *handler, c *command, req *api.ExecRequest) (*session, error) {
	p, sio, err := h.spawn(c)
	if err != nil {
		return nil, err
	}
	ss := r.add(p, c, true, sio)
	size := req.BufferSize
	if size == 0 {
		size = api.DefaultSessionBuffer
	}
	for _, o := range sio.outs {
		ss.outs = append(ss.outs, sessionOutput{stream: o.stream, f: o.f, ring: proc.NewRing(size)})
	}
	if sio.stdin != nil {
		ss.stdinQ = make(chan []byte, stdinQueue)
		go ss.writeStdin()
	}
	ss.log.Info("session started", "tty", c.tty, "buffer", size)
	go ss.collect(r)
	return ss, nil
}

// watch records the exit of a session an exec socket serves.
func (r *sessions) watch(ss *session) {
	go func() {
		<-ss.proc.Done()
		ss.finish(r)
	}()
}

// finish records the exit status (the process has been reaped), prunes
// the registry and only then marks ss exited, so whoever waited on it sees
// the registry already pruned.
func (ss *session) finish(r *sessions) {
	ss.code = proc.ExitCode(ss.proc.Status())
	ss.exited = time.Now().UTC()
	r.exited(ss)
	close(ss.done)
}

// exited prunes the registry as ss exits: beyond the newest
// api.MaxExitedSessions exited sessions, the oldest go.
func (r *sessions) exited(ss *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	gone := func(s *session) bool { return s == ss || s.hasExited() }
	n := 0
	for _, s := range r.list {
		if gone(s) {
			n++
		}
	}
	if n <= api.MaxExitedSessions {
		return
	}
	// Drop the exited sessions that exited first, not those started first.
	var ex []*session
	for _, s := range r.list {
		if gone(s) {
			ex = append(ex, s)
		}
	}
	slices.SortStableFunc(ex, func(a, b *session) int { return a.exited.Compare(b.exited) })
	for _, s := range ex[:n-api.MaxExitedSessions] {
		r.forgetLocked(s)
	}
}

func (r *sessions) forgetLocked(ss *session) {
	delete(r.byID, ss.id)
	r.list = slices.DeleteFunc(r.list, func(s *session) bool { return s == ss })
}

// get returns a session, or a not_found error.
func (r *sessions) get(id string) (*session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ss, ok := r.byID[id]
	if !ok {
		return nil, api.Errorf(api.CodeNotFound, "no session %q", id)
	}
	return ss, nil
}

// all returns every session, oldest first.
func (r *sessions) all() []api.Session {
	r.mu.Lock()
	list := slices.Clone(r.list)
	r.mu.Unlock()
	out := make([]api.Session, 0, len(list))
	for _, ss := range list {
		out = append(out, ss.view())
	}
	return out
}

// remove kills ss's whole process tree and forgets it.
func (r *sessions) remove(ss *session) {
	ss.reaper.KillTree(ss.proc, ss.log)
	r.mu.Lock()
	r.forgetLocked(ss)
	r.mu.Unlock()
}

func (ss *session) hasExited() bool {
	select {
	case <-ss.done:
		return true
	default:
		return false
	}
}

// view is the session as the API shows it.
func (ss *session) view() api.Session {
	v := api.Session{
		ID: ss.id, PID: ss.proc.PID(), Cmd: ss.cmd, TTY: ss.tty, Detachable: ss.detachable,
		State: api.SessionRunning, StartedAt: ss.started,
	}
	if ss.hasExited() {
		code, at := ss.code, ss.exited
		v.State, v.ExitCode, v.ExitedAt = api.SessionExited, &code, &at
	}
	return v
}

// collect moves a detachable session's output into its rings until the
// main process has exited and its output is read, then records the exit.
func (ss *session) collect(r *sessions) {
	pumpOutputs(ss.outs, ss.proc.Done())
	for _, o := range ss.outs {
		o.ring.Close()
	}
	ss.sio.close()
	ss.finish(r)
	ss.log.Info("session exited", "exit_code", ss.code)
}

// pumpOutputs copies outs into their rings until exited is closed and
// their output is read. As on an exec socket, output of background
// children that keep the pipes open is read only for a short grace after
// the main process exits. It neither closes the rings nor the files.
func pumpOutputs(outs []sessionOutput, exited <-chan struct{}) {
	var pumps sync.WaitGroup
	for _, o := range outs {
		pumps.Go(func() { pumpOutput(o) })
	}
	pumped := make(chan struct{})
	go func() {
		pumps.Wait()
		close(pumped)
	}()
	<-exited
	var giveUp <-chan time.Time
	deadline := time.Now().Add(outputGrace)
	for _, o := range outs {
		if err := o.f.SetReadDeadline(deadline); err != nil {
			giveUp = time.After(outputGrace)
		}
	}
	select {
	case <-pumped:
	case <-giveUp:
	}
}

// pumpOutput copies one output into its ring until EOF, or until the
// deadline set when the main process exits; then it takes what the pipe
// still holds.
func pumpOutput(o sessionOutput) {
	buf := make([]byte, maxFrame-1)
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			o.ring.Write(buf[:n])
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			drainFile(o.f, buf, drainLimit, o.ring)
			return
		default:
			return
		}
	}
}

// drainFile writes to w what f holds now, up to limit bytes, without
// waiting for more.
func drainFile(f *os.File, buf []byte, limit int, w io.Writer) {
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for done := 0; done < limit; {
		var n int
		var readErr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, readErr = unix.Read(int(fd), buf)
				if readErr != unix.EINTR {
					return true
				}
			}
		})
		if err != nil || readErr != nil || n <= 0 {
			return
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return
		}
		done += n
	}
}

// writeStdin writes queued stdin to the process until "eof" or its exit.
func (ss *session) writeStdin() {
	var err error
	for {
		select {
		case b, ok := <-ss.stdinQ:
			if !ok {
				ss.sio.stdin.Close()
				return
			}
			if err == nil {
				_, err = ss.sio.stdin.Write(b)
			}
		case <-ss.done:
			return
		}
	}
}

// queueStdin hands b to writeStdin, waiting while the queue is full.
func (ss *session) queueStdin(ctx context.Context, b []byte) {
	ss.stdinMu.Lock()
	defer ss.stdinMu.Unlock()
	if ss.stdinQ == nil || ss.stdinEOF {
		return
	}
	select {
	case ss.stdinQ <- b:
	case <-ctx.Done():
	case <-ss.done:
	}
}

// closeStdin acts on a client's "eof".
func (ss *session) closeStdin(ctx context.Context) {
	if ss.tty {
		// As on exec: type ^D.
		ss.queueStdin(ctx, []byte{4})
		return
	}
	ss.stdinMu.Lock()
	defer ss.stdinMu.Unlock()
	if ss.stdinQ != nil && !ss.stdinEOF {
		ss.stdinEOF = true
		close(ss.stdinQ)
	}
}

// signal sends sig to the session's process group.
func (ss *session) signal(sig syscall.Signal) error {
	err := ss.reaper.Signal(ss.proc, sig)
	if errors.Is(err, proc.ErrExited) {
		return api.Errorf(api.CodeConflict, "session %s has exited", ss.id)
	}
	return err
}

// attachFrom is where an attach starts in each stream (nil for everything
// still buffered) and whether it follows live output.
type attachFrom struct {
	stdout, stderr *int64
	// noFollow ends the attach once what was buffered when it began is
	// sent: with "exit" if the session has exited by then, else with a
	// normal close and no "exit".
	noFollow bool
}

// parseAttachFrom reads where an attach (or a service's logs) starts from
// its query: offset and stderr_offset (stderr's defaults to offset), and
// follow.
func parseAttachFrom(q url.Values) (attachFrom, error) {
	var from attachFrom
	for _, p := range []struct {
		name string
		to   **int64
	}{{"offset", &from.stdout}, {"stderr_offset", &from.stderr}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return from, api.Errorf(api.CodeInvalid, "%s must be a byte offset (0 or more)", p.name)
		}
		*p.to = &n
	}
	if from.stderr == nil {
		from.stderr = from.stdout
	}
	switch q.Get("follow") {
	case "", "true":
	case "false":
		from.noFollow = true
	default:
		return from, api.Errorf(api.CodeInvalid, "follow must be true or false")
	}
	return from, nil
}

// attach serves one attach socket of a detachable session (see
// api/session.go) until the session has exited and all its output was sent,
// or the client goes away. The session runs on either way.
func (ss *session) attach(ctx context.Context, conn *websocket.Conn, from attachFrom) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wmu sync.Mutex
	send := func(typ websocket.MessageType, b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return conn.Write(ctx, typ, b)
	}
	if send(websocket.MessageText, control(api.ExecControl{Type: api.ExecStarted, PID: ss.proc.PID(), Session: ss.id})) != nil {
		return
	}
	go func() {
		defer cancel()
		ss.readClient(ctx, conn)
	}()
	var outs sync.WaitGroup
	failed := make(chan struct{}, len(ss.outs))
	for _, o := range ss.outs {
		off := from.stdout
		if o.stream == api.StreamStderr && from.stderr != nil {
			off = from.stderr
		}
		until := int64(-1)
		if from.noFollow {
			_, until = o.ring.Bounds()
		}
		outs.Go(func() {
			if followOutput(ctx, o, off, until, send) != nil {
				failed <- struct{}{}
			}
		})
	}
	outs.Wait()
	if len(failed) > 0 || ctx.Err() != nil {
		return
	}
	if from.noFollow && !ss.hasExited() {
		conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	select {
	case <-ss.done:
	case <-ctx.Done():
		return
	}
	code := ss.code
	if send(websocket.MessageText, control(api.ExecControl{Type: api.ExecExit, ExitCode: &code})) == nil {
		conn.Close(websocket.StatusNormalClosure, "")
	}
}

// followOutput sends one output stream from offset *from (everything
// buffered when nil) until the ring is closed and read, or up to offset
// until when it is not negative. It says where the bytes
// start, and how many were lost, before the first and after every gap.
func followOutput(ctx context.Context, o sessionOutput, from *int64, until int64, send func(websocket.MessageType, []byte) error) error {
	start, end := o.ring.Bounds()
	off := start
	if from != nil {
		// An offset past the end (a restore rolled the output back)
		// starts at the end; the offset message says so.
		off = min(*from, end)
	}
	buf := make([]byte, maxFrame)
	buf[0] = o.stream
	first := true
	for {
		p := buf[1:]
		if until >= 0 {
			if off >= until {
				return nil
			}
			p = p[:min(int64(len(p)), until-off)]
		}
		n, at, err := o.ring.ReadAt(ctx, p, off)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if first || at != off {
			c := api.ExecControl{Type: api.ExecOffset, Stream: o.stream, Offset: at}
			if at > off {
				c.Dropped = at - off
			}
			if first && from != nil && at > *from {
				c.Dropped = at - *from
			}
			if err := send(websocket.MessageText, control(c)); err != nil {
				return err
			}
			first = false
		}
		if err := send(websocket.MessageBinary, buf[:1+n]); err != nil {
			return err
		}
		off = at + int64(n)
	}
}

// readClient acts on an attached client's messages until its socket ends.
func (ss *session) readClient(ctx context.Context, conn *websocket.Conn) {
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if len(b) > 1 && b[0] == api.StreamStdin {
				ss.queueStdin(ctx, b[1:])
			}
			continue
		}
		var c api.ExecControl
		if json.Unmarshal(b, &c) != nil {
			continue
		}
		switch c.Type {
		case api.ExecEOF:
			ss.closeStdin(ctx)
		case api.ExecSignal:
			if sig := signalByName(c.Signal); sig != 0 {
				_ = ss.signal(sig)
			}
		case api.ExecResize:
			if ss.sio.master != nil && c.Rows > 0 && c.Cols > 0 && c.Rows <= 0xffff && c.Cols <= 0xffff {
				_ = proc.SetTerminalSize(ss.sio.master, uint16(c.Rows), uint16(c.Cols))
			}
		}
	}
}
