package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/store"
)

// filesVersion is the agent protocol version that brought the files API.
const filesVersion = 3

// FileQuery names a file of a sandbox for the files API and the sandbox
// user a call acts as ("" for the default user, "loam").
type FileQuery struct {
	Path string
	User string
	// Range is the part of the file ReadFile reads; the whole file when
	// nil.
	Range *api.ReadRange
}

// check checks the shape of q (the agent resolves it, never the daemon).
func (q FileQuery) check() error {
	if err := api.CheckFilePath("path", q.Path); err != nil {
		return err
	}
	return api.CheckFileUser(q.User)
}

func (q FileQuery) agent() agent.FileQuery {
	return agent.FileQuery{Path: q.Path, User: q.User, Range: q.Range}
}

// fileCall is one files call in flight to a sandbox's agent. The Manager
// cuts them all, as it ends streams, before a memory checkpoint or a
// restore, so that no connection into the sandbox is in its memory image.
type fileCall struct {
	cancel context.CancelCauseFunc
}

// errCallEnded is the cause a call is cut with; its text says why.
type errCallEnded struct{ reason string }

func (e *errCallEnded) Error() string { return e.reason }

// endCalls cuts every files call in flight to sandbox id.
func (m *Manager) endCalls(id, reason string) {
	l := m.peek(id)
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.calls {
		c.cancel(&errCallEnded{reason: reason})
	}
}

// startCall checks that sandbox ref can take a files call now and
// registers one. It returns the sandbox, a client of its agent, the call's
// context (cut by endCalls) and the func that ends the call.
func (m *Manager) startCall(ctx context.Context, ref string) (*store.Sandbox, *agent.Client, context.Context, func(), error) {
	for {
		sb, ac, cctx, end, err := m.tryCall(ctx, ref)
		if !errors.Is(err, errHeld) {
			return sb, ac, cctx, end, err
		}
	}
}

// errHeld is tryCall's: calls were held (a memory checkpoint began) after
// the sandbox was read; read it again once they go on.
var errHeld = errors.New("calls held")

func (m *Manager) tryCall(ctx context.Context, ref string) (*store.Sandbox, *agent.Client, context.Context, func(), error) {
	// A hold may begin and end (the checkpoint taken, the agent's token
	// moved on) between the look at the sandbox and the registration
	// below: the sandbox's live object tells (heldSince), and the sandbox
	// is read again.
	start := time.Now()
	sb, err := m.awake(ctx, ref)
	if err == nil {
		err = requireState(sb.Name, sb.State, api.StateRunning)
	}
	if err == nil {
		err = m.requireAgent(sb, filesVersion, "the files API")
	}
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ep, err := m.Endpoint(sb)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cctx, cancel := context.WithCancelCause(ctx)
	c := &fileCall{cancel: cancel}
	l := m.live(sb.ID)
	l.mu.Lock()
	// A call registered before a checkpoint holds calls is cut by it; one
	// that comes after must wait (in awake), or it would carry the token
	// read above past the checkpoint's new one.
	if l.heldSinceLocked(start) {
		l.mu.Unlock()
		cancel(nil)
		return nil, nil, nil, nil, errHeld
	}
	if l.calls == nil {
		l.calls = map[*fileCall]bool{}
	}
	l.calls[c] = true
	l.mu.Unlock()
	end := func() {
		l.mu.Lock()
		delete(l.calls, c)
		l.mu.Unlock()
		cancel(nil)
	}
	return sb, m.callClient(sb, ep), cctx, end, nil
}

// fileError is what the API says for err, a failure of a files call (what,
// an action on path) on sb whose context was cctx. The agent's answer
// chooses no error class by itself: only the statuses the files protocol
// defines map to the user's mistakes, in loam's words, quoting the agent.
func (m *Manager) fileError(cctx context.Context, sb *store.Sandbox, what, path string, err error) error {
	var ended *errCallEnded
	if errors.As(context.Cause(cctx), &ended) {
		return api.Errorf(api.CodeUnavailable, "%s %s in sandbox %s was cut short: %s; try again", what, path, sb.Name, ended.reason)
	}
	var ae *agent.Error
	if !errors.As(err, &ae) {
		if cctx.Err() != nil {
			return err // the caller went away
		}
		m.log.Warn("files call failed", "sandbox", sb.ID, "what", what, "err", err)
		return api.Errorf(api.CodeUnavailable, "%s %s in sandbox %s: the sandbox's agent does not answer", what, path, sb.Name)
	}
	var code api.Code
	var says string
	switch ae.Status {
	case http.StatusBadRequest:
		code, says = api.CodeInvalid, "refused"
	case http.StatusForbidden:
		code, says = api.CodeForbidden, "permission denied"
	case http.StatusNotFound:
		code, says = api.CodeNotFound, "not found"
	case http.StatusConflict:
		code, says = api.CodeConflict, "in conflict with what is there"
	case http.StatusInsufficientStorage:
		code, says = api.CodeInsufficientStorage, "the sandbox's disk is full"
	default:
		return publicError(fmt.Errorf("%s %s in %s: %w", what, path, sb.ID, err))
	}
	return api.Errorf(code, "%s %s in sandbox %s: %s (the sandbox says %q)", what, path, sb.Name, says, ae.Message)
}

// uploadError is fileError for an upload into sb. The sandbox cannot tell
// its own disk limit reached from the host's filesystem full: both are
// "no space" to it, and its answer (insufficient_storage, or a conflict
// from an older agent) is not trusted to say which. The host looks for
// itself: when the filesystem its disk lives on is down to the reserve, the
// upload failed for the host's lack of room, and the error says so;
// otherwise the sandbox's disk is full, and the answer stays what it was.
// The same goes for an upload whose connection broke (unavailable): an
// agent of before the drain (see the agent's bodyError), still running in
// a sandbox restored from an old memory checkpoint, answers and closes the
// connection while the body still comes, and the reset can beat its answer.
func (m *Manager) uploadError(cctx context.Context, sb *store.Sandbox, what, path string, err error) error {
	ferr := m.fileError(cctx, sb, what, path, err)
	if !errors.Is(ferr, api.ErrConflict) && !errors.Is(ferr, api.ErrUnavailable) && !errors.Is(ferr, api.ErrInsufficientStorage) {
		return ferr
	}
	vol := m.disks.VolumePath(sb.ID)
	if free, serr := disk.FreeBytes(vol); serr == nil && free < disk.ReserveBytes {
		m.log.Warn("upload failed with the host out of space", "sandbox", sb.ID, "err", err)
		return disk.SpaceError(fmt.Errorf("%s %s: %w", what, path, syscall.ENOSPC), vol, "an upload to "+path)
	}
	return ferr
}

// StatFile describes a file of a sandbox and, for a directory, its entries
// depth levels deep.
func (m *Manager) StatFile(ctx context.Context, ref string, q FileQuery, depth int) (*api.FileInfo, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	if depth < 0 || depth > api.MaxFileDepth {
		return nil, api.Errorf(api.CodeInvalid, "depth: %d is not from 0 to %d", depth, api.MaxFileDepth)
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer end()
	info, err := ac.Stat(cctx, q.agent(), depth)
	if err != nil {
		return nil, m.fileError(cctx, sb, "listing", q.Path, err)
	}
	return &info, nil
}

// ReadFile opens a file of a sandbox for reading, streamed from the agent;
// the caller closes it. size is its length. A read that fails part-way
// (a memory checkpoint cut it) says why.
func (m *Manager) ReadFile(ctx context.Context, ref string, q FileQuery) (io.ReadCloser, int64, error) {
	if err := q.check(); err != nil {
		return nil, 0, err
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return nil, 0, err
	}
	body, size, err := ac.ReadFile(cctx, q.agent())
	if err != nil {
		end()
		return nil, 0, m.fileError(cctx, sb, "reading", q.Path, err)
	}
	if q.Range != nil && q.Range.Length >= 0 && (size < 0 || size > q.Range.Length) {
		// The agent's answer is the sandbox's word: never more than asked.
		body.Close()
		end()
		m.log.Warn("files: the agent answered a range read with more than asked", "sandbox", sb.ID, "asked", q.Range.Length, "size", size)
		return nil, 0, api.Errorf(api.CodeUnavailable, "reading %s in %s: the sandbox's agent answered with %d bytes for a range of %d", q.Path, sb.Name, size, q.Range.Length)
	}
	return &callBody{ReadCloser: body, end: end, errf: func(err error) error {
		return m.fileError(cctx, sb, "reading", q.Path, err)
	}}, size, nil
}

// callBody is a body streamed from an agent within a call, which it ends
// when closed.
type callBody struct {
	io.ReadCloser
	end  func()
	errf func(error) error
}

func (b *callBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		err = b.errf(err)
	}
	return n, err
}

func (b *callBody) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
}

// WriteFile writes body (size bytes, -1 when unknown) to a file of a
// sandbox atomically, streaming it to the agent. mode is octal ("0644"),
// or empty to keep the mode of the file replaced (0644 for a new one).
func (m *Manager) WriteFile(ctx context.Context, ref string, q FileQuery, mode string, body io.Reader, size int64) (*api.FileInfo, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	if err := checkMode(mode); err != nil {
		return nil, err
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer end()
	if err := disk.RequireSpace(m.disks.VolumePath(sb.ID), "an upload", max(size, 0)); err != nil {
		return nil, err
	}
	info, err := ac.WriteFile(cctx, q.agent(), mode, body, size)
	if err != nil {
		return nil, m.uploadError(cctx, sb, "writing", q.Path, err)
	}
	return &info, nil
}

// checkMode checks an octal permission mode; "" is none.
func checkMode(mode string) error {
	if mode == "" {
		return nil
	}
	if m, err := strconv.ParseUint(mode, 8, 32); err != nil || m > 0o7777 {
		return api.Errorf(api.CodeInvalid, "mode: %q is not an octal mode such as 0644", mode)
	}
	return nil
}

// Mkdir makes a directory of a sandbox, and its parents.
func (m *Manager) Mkdir(ctx context.Context, ref string, req api.MkdirRequest) (*api.FileInfo, error) {
	if err := (FileQuery{Path: req.Path, User: req.User}).check(); err != nil {
		return nil, err
	}
	if err := checkMode(req.Mode); err != nil {
		return nil, err
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer end()
	info, err := ac.Mkdir(cctx, req)
	if err != nil {
		return nil, m.fileError(cctx, sb, "making", req.Path, err)
	}
	return &info, nil
}

// MoveFile renames a file of a sandbox.
func (m *Manager) MoveFile(ctx context.Context, ref string, req api.MoveRequest) (*api.FileInfo, error) {
	if err := api.CheckFilePath("from", req.From); err != nil {
		return nil, err
	}
	if err := (FileQuery{Path: req.To, User: req.User}).check(); err != nil {
		return nil, err
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer end()
	info, err := ac.Move(cctx, req)
	if err != nil {
		return nil, m.fileError(cctx, sb, "moving", req.From, err)
	}
	return &info, nil
}

// RemoveFile removes a file of a sandbox, or a directory and all it holds
// when recursive.
func (m *Manager) RemoveFile(ctx context.Context, ref string, q FileQuery, recursive bool) error {
	if err := q.check(); err != nil {
		return err
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return err
	}
	defer end()
	if err := ac.Remove(cctx, q.agent(), recursive); err != nil {
		return m.fileError(cctx, sb, "removing", q.Path, err)
	}
	return nil
}

// ReadArchive opens a tar of a directory of a sandbox, streamed from the
// agent; the caller closes it.
func (m *Manager) ReadArchive(ctx context.Context, ref string, q FileQuery) (io.ReadCloser, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return nil, err
	}
	body, err := ac.ReadArchive(cctx, q.agent())
	if err != nil {
		end()
		return nil, m.fileError(cctx, sb, "archiving", q.Path, err)
	}
	return &callBody{ReadCloser: body, end: end, errf: func(err error) error {
		return m.fileError(cctx, sb, "archiving", q.Path, err)
	}}, nil
}

// WriteArchive extracts a tar, streamed to the agent, into a directory of
// a sandbox.
func (m *Manager) WriteArchive(ctx context.Context, ref string, q FileQuery, tar io.Reader) error {
	if err := q.check(); err != nil {
		return err
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return err
	}
	defer end()
	if err := disk.RequireSpace(m.disks.VolumePath(sb.ID), "an upload", 0); err != nil {
		return err
	}
	if err := ac.WriteArchive(cctx, q.agent(), tar); err != nil {
		return m.uploadError(cctx, sb, "extracting into", q.Path, err)
	}
	return nil
}

// Watch opens a watch of a file or directory of a sandbox (recursive: the
// directories below it too) and returns it as a Stream of api.WatchEvent
// text messages for the caller to proxy. A memory checkpoint or a restore
// ends it, as every stream.
func (m *Manager) Watch(ctx context.Context, ref string, q FileQuery, recursive bool) (*Stream, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	sb, ac, cctx, end, err := m.startCall(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer end()
	conn, err := ac.DialWatch(cctx, q.agent(), recursive)
	if err != nil {
		return nil, m.fileError(cctx, sb, "watching", q.Path, err)
	}
	s := newStream(conn, watchEvent)
	m.addStream(sb.ID, s)
	return s, nil
}

// watchEvent passes on an agent's watch event as loam's: only the fields
// and types of api.WatchEvent, a path no longer than a path may be.
func watchEvent(data []byte) []byte {
	var ev api.WatchEvent
	if json.Unmarshal(data, &ev) != nil || len(ev.Path) > api.MaxFilePath {
		ev = api.WatchEvent{Type: api.WatchOverflow}
	}
	switch ev.Type {
	case api.WatchCreate, api.WatchWrite, api.WatchRemove, api.WatchRename, api.WatchChmod, api.WatchOverflow:
	default:
		ev = api.WatchEvent{Type: api.WatchOverflow}
	}
	out, _ := json.Marshal(ev)
	return out
}
