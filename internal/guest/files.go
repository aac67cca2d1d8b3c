package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"syscall"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/agentconn"
	"loam.dev/loam/internal/disk"
	"loam.dev/loam/internal/sandbox"
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

// filesNeed is what every files call needs: an agent with the files API,
// and to be cut by a memory checkpoint or a restore, so that no
// connection into the sandbox is in its memory image.
var filesNeed = sandbox.Need{Protocol: filesVersion, What: "the files API", Cut: true}

// fileError is what the API says for err, a failure of files call c (what,
// an action on path): cut short by a checkpoint, or as agentconn.Map
// says. The agent's answer chooses no error class by itself: only the
// statuses the files protocol defines map to the user's mistakes, in
// loam's words, quoting the agent.
func (g *Guest) fileError(c *sandbox.Call, what, path string, err error) error {
	return g.callError(c.Ctx, c.Cut(), c.Sandbox, what, path, err)
}

// callError is fileError for a call on sb made with ctx, that a checkpoint
// cut (why) or not ("").
func (g *Guest) callError(ctx context.Context, cut string, sb *store.Sandbox, what, path string, err error) error {
	if cut != "" {
		return api.Errorf(api.CodeUnavailable, "%s %s in sandbox %s was cut short: %s; try again", what, path, sb.Name, cut)
	}
	return agentconn.Map(ctx, err, func(ae *agent.Error) error {
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
			return nil
		}
		return api.Errorf(code, "%s %s in sandbox %s: %s (the sandbox says %q)", what, path, sb.Name, says, ae.Message)
	}, func() error {
		g.log.Warn("files call failed", "sandbox", sb.ID, "what", what, "err", err)
		return api.Errorf(api.CodeUnavailable, "%s %s in sandbox %s: the sandbox's agent does not answer", what, path, sb.Name)
	})
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
func (g *Guest) uploadError(c *sandbox.Call, what, path string, err error) error {
	sb := c.Sandbox
	ferr := g.fileError(c, what, path, err)
	if !errors.Is(ferr, api.ErrConflict) && !errors.Is(ferr, api.ErrUnavailable) && !errors.Is(ferr, api.ErrInsufficientStorage) {
		return ferr
	}
	vol := c.Volume()
	if free, serr := disk.FreeBytes(vol); serr == nil && free < disk.ReserveBytes {
		g.log.Warn("upload failed with the host out of space", "sandbox", sb.ID, "err", err)
		return disk.SpaceError(fmt.Errorf("%s %s: %w", what, path, syscall.ENOSPC), vol, "an upload to "+path)
	}
	return ferr
}

// StatFile describes a file of a sandbox and, for a directory, its entries
// depth levels deep.
func (g *Guest) StatFile(ctx context.Context, ref string, q FileQuery, depth int) (*api.FileInfo, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	if depth < 0 || depth > api.MaxFileDepth {
		return nil, api.Errorf(api.CodeInvalid, "depth: %d is not from 0 to %d", depth, api.MaxFileDepth)
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return nil, err
	}
	defer c.End()
	info, err := c.Agent.Stat(c.Ctx, q.agent(), depth)
	if err != nil {
		return nil, g.fileError(c, "listing", q.Path, err)
	}
	return &info, nil
}

// ReadFile opens a file of a sandbox for reading, streamed from the agent;
// the caller closes it. size is its length. A read that fails part-way
// (a memory checkpoint cut it) says why.
func (g *Guest) ReadFile(ctx context.Context, ref string, q FileQuery) (io.ReadCloser, int64, error) {
	if err := q.check(); err != nil {
		return nil, 0, err
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return nil, 0, err
	}
	body, size, err := c.Agent.ReadFile(c.Ctx, q.agent())
	if err != nil {
		c.End()
		return nil, 0, g.fileError(c, "reading", q.Path, err)
	}
	if q.Range != nil && q.Range.Length >= 0 && (size < 0 || size > q.Range.Length) {
		// The agent's answer is the sandbox's word: never more than asked.
		body.Close()
		c.End()
		g.log.Warn("files: the agent answered a range read with more than asked", "sandbox", c.Sandbox.ID, "asked", q.Range.Length, "size", size)
		return nil, 0, api.Errorf(api.CodeUnavailable, "reading %s in %s: the sandbox's agent answered with %d bytes for a range of %d", q.Path, c.Sandbox.Name, size, q.Range.Length)
	}
	return &callBody{ReadCloser: body, end: c.End, errf: func(err error) error {
		return g.fileError(c, "reading", q.Path, err)
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
func (g *Guest) WriteFile(ctx context.Context, ref string, q FileQuery, mode string, body io.Reader, size int64) (*api.FileInfo, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	if err := checkMode(mode); err != nil {
		return nil, err
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return nil, err
	}
	defer c.End()
	if err := disk.RequireSpace(c.Volume(), "an upload", max(size, 0)); err != nil {
		return nil, err
	}
	info, err := c.Agent.WriteFile(c.Ctx, q.agent(), mode, body, size)
	if err != nil {
		return nil, g.uploadError(c, "writing", q.Path, err)
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
func (g *Guest) Mkdir(ctx context.Context, ref string, req api.MkdirRequest) (*api.FileInfo, error) {
	if err := (FileQuery{Path: req.Path, User: req.User}).check(); err != nil {
		return nil, err
	}
	if err := checkMode(req.Mode); err != nil {
		return nil, err
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return nil, err
	}
	defer c.End()
	info, err := c.Agent.Mkdir(c.Ctx, req)
	if err != nil {
		return nil, g.fileError(c, "making", req.Path, err)
	}
	return &info, nil
}

// MoveFile renames a file of a sandbox.
func (g *Guest) MoveFile(ctx context.Context, ref string, req api.MoveRequest) (*api.FileInfo, error) {
	if err := api.CheckFilePath("from", req.From); err != nil {
		return nil, err
	}
	if err := (FileQuery{Path: req.To, User: req.User}).check(); err != nil {
		return nil, err
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return nil, err
	}
	defer c.End()
	info, err := c.Agent.Move(c.Ctx, req)
	if err != nil {
		return nil, g.fileError(c, "moving", req.From, err)
	}
	return &info, nil
}

// RemoveFile removes a file of a sandbox, or a directory and all it holds
// when recursive.
func (g *Guest) RemoveFile(ctx context.Context, ref string, q FileQuery, recursive bool) error {
	if err := q.check(); err != nil {
		return err
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return err
	}
	defer c.End()
	if err := c.Agent.Remove(c.Ctx, q.agent(), recursive); err != nil {
		return g.fileError(c, "removing", q.Path, err)
	}
	return nil
}

// ReadArchive opens a tar of a directory of a sandbox, streamed from the
// agent; the caller closes it.
func (g *Guest) ReadArchive(ctx context.Context, ref string, q FileQuery) (io.ReadCloser, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return nil, err
	}
	body, err := c.Agent.ReadArchive(c.Ctx, q.agent())
	if err != nil {
		c.End()
		return nil, g.fileError(c, "archiving", q.Path, err)
	}
	return &callBody{ReadCloser: body, end: c.End, errf: func(err error) error {
		return g.fileError(c, "archiving", q.Path, err)
	}}, nil
}

// WriteArchive extracts a tar, streamed to the agent, into a directory of
// a sandbox.
func (g *Guest) WriteArchive(ctx context.Context, ref string, q FileQuery, tar io.Reader) error {
	if err := q.check(); err != nil {
		return err
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return err
	}
	defer c.End()
	if err := disk.RequireSpace(c.Volume(), "an upload", 0); err != nil {
		return err
	}
	if err := c.Agent.WriteArchive(c.Ctx, q.agent(), tar); err != nil {
		return g.uploadError(c, "extracting into", q.Path, err)
	}
	return nil
}

// Watch opens a watch of a file or directory of a sandbox (recursive: the
// directories below it too) and returns it as a Stream of api.WatchEvent
// text messages for the caller to proxy. A memory checkpoint or a restore
// ends it, as every stream.
func (g *Guest) Watch(ctx context.Context, ref string, q FileQuery, recursive bool) (*sandbox.Stream, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	c, err := g.core.Relay(ctx, ref, filesNeed)
	if err != nil {
		return nil, err
	}
	defer c.End()
	conn, err := c.Agent.DialWatch(c.Ctx, q.agent(), recursive)
	if err != nil {
		return nil, g.fileError(c, "watching", q.Path, err)
	}
	return c.Stream(conn, watchEvent), nil
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
