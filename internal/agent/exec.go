package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent/account"
	"loam.dev/loam/internal/agent/proc"
)

const (
	// maxFrame is the largest binary message the agent sends (stream byte
	// included). It fits the default read limit of WebSocket clients such
	// as coder/websocket's (32 KiB), so a proxy can pass frames on as they are.
	maxFrame = 32 << 10
	// maxClientMessage bounds one message from the client (as the
	// daemon bounds it: api.MaxExecMessage).
	maxClientMessage = api.MaxExecMessage
	// requestTimeout bounds the wait for the ExecRequest.
	requestTimeout = 30 * time.Second
	// outputGrace is how long output is still awaited after the main
	// process exits: a background child (`cmd &`) may hold the pipes open
	// for ever, and the exec must not wait for it.
	outputGrace = 100 * time.Millisecond
	// drainLimit bounds what is read after outputGrace without waiting:
	// more than a pipe or a terminal holds, so all the main process wrote,
	// yet finite when a background child writes without end.
	drainLimit = 1 << 20
	// stdinQueue is how many stdin messages may wait for the process to
	// read them, so that control messages (signals) still get through
	// while a process is slow to read its input. Beyond it, the client
	// waits: stdin is never buffered without bound.
	stdinQueue = 8
	// The terminal size when the request gives none.
	defaultRows, defaultCols = 24, 80
)

// serveExec serves one exec socket: see api/exec.go for the protocol.
func (h *handler) serveExec(w http.ResponseWriter, r *http.Request) {
	// Origins are not checked: a browser cannot put the bearer token on a
	// WebSocket request, so a cross-site page never gets this far.
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		h.log.Warn("exec: accepting the websocket", "err", err)
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxClientMessage)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	req, err := readRequest(ctx, conn)
	if err != nil {
		h.refuse(ctx, conn, err)
		return
	}
	cmd, err := h.prepare(req)
	if err != nil {
		h.refuse(ctx, conn, err)
		return
	}
	if req.Detachable {
		ss, err := h.sessions.start(h, cmd, req)
		if err != nil {
			h.refuse(ctx, conn, err)
			return
		}
		ss.attach(ctx, conn, attachFrom{})
		return
	}
	s, err := h.start(conn, cmd)
	if err != nil {
		h.refuse(ctx, conn, err)
		return
	}
	s.run(ctx)
}

// refuse tells the client why its command did not start and closes the
// socket. Causes that are not the client's are logged, not sent.
func (h *handler) refuse(ctx context.Context, conn *websocket.Conn, err error) {
	var e *api.Error
	if errors.As(err, &e) {
		h.log.Info("exec refused", "code", e.Code, "reason", e.Message)
	} else {
		h.log.Warn("exec failed", "err", err)
		e = api.Errorf(api.CodeInternal, "the agent could not start the command")
	}
	b, _ := json.Marshal(api.ExecControl{Type: api.ExecError, Error: e})
	if conn.Write(ctx, websocket.MessageText, b) == nil {
		conn.Close(websocket.StatusNormalClosure, "")
	}
}

// readRequest reads and checks the first message of an exec socket.
func readRequest(ctx context.Context, conn *websocket.Conn) (*api.ExecRequest, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	typ, b, err := conn.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the exec request: %w", err)
	}
	if typ != websocket.MessageText {
		return nil, api.Errorf(api.CodeInvalid, "the first message must be a text message holding the exec request")
	}
	var req api.ExecRequest
	if err := json.Unmarshal(b, &req); err != nil {
		return nil, api.Errorf(api.CodeInvalid, "the exec request is not valid JSON")
	}
	if err := checkRequest(&req); err != nil {
		return nil, err
	}
	return &req, nil
}

// checkRequest checks what an exec request holds before it is resolved.
func checkRequest(req *api.ExecRequest) error {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return api.Errorf(api.CodeInvalid, "cmd is empty")
	}
	for _, a := range req.Cmd {
		if strings.ContainsRune(a, 0) {
			return api.Errorf(api.CodeInvalid, "cmd holds a NUL byte")
		}
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return api.Errorf(api.CodeInvalid, "env: %q is not a valid variable", k)
		}
	}
	if strings.ContainsRune(req.Dir, 0) || strings.ContainsRune(req.User, 0) {
		return api.Errorf(api.CodeInvalid, "dir or user holds a NUL byte")
	}
	if req.BufferSize < 0 || req.BufferSize > api.MaxSessionBuffer {
		return api.Errorf(api.CodeInvalid, "buffer_size must be between 0 (the default, %d) and %d bytes", api.DefaultSessionBuffer, api.MaxSessionBuffer)
	}
	if req.Rows < 0 || req.Rows > 0xffff || req.Cols < 0 || req.Cols > 0xffff {
		return api.Errorf(api.CodeInvalid, "rows and cols must be between 0 and 65535")
	}
	return nil
}

// command is an exec request resolved against the sandbox: what to execve,
// as whom, where.
type command struct {
	path       string // the file to execute
	argv       []string
	env        []string
	dir        string
	user       string
	cred       *syscall.Credential // nil to run as the agent's own user
	tty        bool
	rows, cols uint16
	stdin      bool
}

// prepare resolves req's user, directory, environment and program.
func (h *handler) prepare(req *api.ExecRequest) (*command, error) {
	name := req.User
	if name == "" {
		name = h.user
	}
	acct, err := account.Lookup(h.passwdPath, h.groupPath, name)
	if errors.Is(err, account.ErrNoAccount) {
		return nil, api.Errorf(api.CodeInvalid, "user %q does not exist in this sandbox", name)
	}
	if err != nil {
		return nil, err
	}
	reqDir := req.Dir
	if reqDir == "" {
		reqDir = h.dir
	}
	dir, err := workDir(reqDir, acct.Home)
	if err != nil {
		return nil, err
	}
	cred, err := credential(acct)
	if err != nil {
		return nil, err
	}
	c := &command{
		path:  req.Cmd[0],
		argv:  req.Cmd,
		env:   account.BuildEnv(h.env, acct, req.TTY, h.secretEnv(req.Env)),
		dir:   dir,
		user:  acct.Name,
		cred:  cred,
		tty:   req.TTY,
		rows:  uint16(req.Rows),
		cols:  uint16(req.Cols),
		stdin: req.Stdin,
	}
	if c.rows == 0 {
		c.rows = defaultRows
	}
	if c.cols == 0 {
		c.cols = defaultCols
	}
	if !strings.Contains(c.path, "/") {
		p, ok := account.LookPath(c.path, account.EnvValue(c.env, "PATH"), dir, acct)
		if !ok {
			return nil, api.Errorf(api.CodeNotFound, "exec: %q: executable file not found in $PATH", c.path)
		}
		c.path = p
	}
	return c, nil
}

// workDir is the directory a command runs in: dir, relative to home when
// it is relative, or home when it is empty. A home that does not exist
// (nobody's is /nonexistent) leaves the command in /, as login does.
func workDir(dir, home string) (string, error) {
	if dir == "" {
		if fi, err := os.Stat(home); err == nil && fi.IsDir() {
			return home, nil
		}
		return "/", nil
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(home, dir)
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", api.Errorf(api.CodeInvalid, "dir %q does not exist", dir)
	case err != nil:
		return "", api.Errorf(api.CodeInvalid, "dir %q cannot be used: %s", dir, errors.Unwrap(err))
	case !fi.IsDir():
		return "", api.Errorf(api.CodeInvalid, "dir %q is not a directory", dir)
	}
	return dir, nil
}

// credential is what a process of a runs with. An agent that is not root
// (in development) can run commands as itself only.
func credential(a account.Account) (*syscall.Credential, error) {
	if os.Geteuid() == 0 {
		return &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: a.Groups}, nil
	}
	if a.UID == uint32(os.Geteuid()) {
		return nil, nil
	}
	return nil, api.Errorf(api.CodeInvalid, "the agent does not run as root and cannot run commands as %q", a.Name)
}

// startError turns a failed execve into what the client should see.
func startError(name string, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.ENOENT:
			return api.Errorf(api.CodeNotFound, "exec: %q: %s", name, errno)
		case unix.EACCES, unix.EPERM, unix.ENOEXEC, unix.EISDIR, unix.ENOTDIR,
			unix.ELOOP, unix.ETXTBSY, unix.E2BIG, unix.ENAMETOOLONG:
			return api.Errorf(api.CodeInvalid, "exec: %q: %s", name, errno)
		}
	}
	return fmt.Errorf("starting %q: %w", name, err)
}

// output is the parent's end of one output stream of a process.
type output struct {
	f      *os.File
	stream byte
}

// stdio is a process's standard input and output, both ends.
type stdio struct {
	child  [3]*os.File // the child's fds 0, 1 and 2; closed once it has started
	stdin  *os.File    // the parent's end of stdin; nil when the client sends none
	outs   []output    // the parent's ends of stdout and stderr, or the terminal
	master *os.File    // the terminal's master side; nil without a terminal
}

// openPipes makes pipes for stdout and stderr, and for stdin if the client
// sends it (else stdin is /dev/null).
func openPipes(withStdin bool) (*stdio, error) {
	sio := &stdio{}
	fail := func(what string, err error) (*stdio, error) {
		sio.closeChild()
		sio.close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if withStdin {
		r, w, err := os.Pipe()
		if err != nil {
			return fail("making the stdin pipe", err)
		}
		sio.child[0], sio.stdin = r, w
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return fail("opening stdin", err)
		}
		sio.child[0] = f
	}
	for i, stream := range []byte{api.StreamStdout, api.StreamStderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return fail("making an output pipe", err)
		}
		sio.child[1+i] = w
		sio.outs = append(sio.outs, output{f: r, stream: stream})
	}
	return sio, nil
}

// openTerminalStdio gives a process a terminal as stdin, stdout and stderr.
func openTerminalStdio(rows, cols uint16) (*stdio, error) {
	master, slave, err := proc.OpenTerminal(rows, cols)
	if err != nil {
		return nil, err
	}
	return &stdio{
		child:  [3]*os.File{slave, slave, slave},
		stdin:  master,
		outs:   []output{{f: master, stream: api.StreamStdout}},
		master: master,
	}, nil
}

// childFds are the descriptors the child gets as 0, 1 and 2. Fd() makes
// them blocking, which is what a child expects of its stdio.
func (sio *stdio) childFds() []uintptr {
	return []uintptr{sio.child[0].Fd(), sio.child[1].Fd(), sio.child[2].Fd()}
}

// closeChild closes the child's ends in the parent, so that the parent's
// ends see EOF once the child and its children have closed theirs.
func (sio *stdio) closeChild() {
	for _, f := range sio.child {
		if f != nil {
			f.Close()
		}
	}
}

// close closes the parent's ends; pending reads and writes on them return.
func (sio *stdio) close() {
	if sio.stdin != nil {
		sio.stdin.Close()
	}
	for _, o := range sio.outs {
		o.f.Close()
	}
}

// spawn starts c with its stdio: in a process group of its own, or with a
// terminal in a session of its own.
func (h *handler) spawn(c *command) (*proc.Process, *stdio, error) {
	var sio *stdio
	var err error
	sys := &syscall.SysProcAttr{Credential: c.cred}
	if c.tty {
		sio, err = openTerminalStdio(c.rows, c.cols)
		// A session of its own with the terminal as controlling terminal:
		// job control works, and closing the master hangs the session up.
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		sio, err = openPipes(c.stdin)
		// A process group of its own, so that signals reach the command's
		// children too.
		sys.Setpgid = true
	}
	if err != nil {
		return nil, nil, fmt.Errorf("starting %q: %w", c.argv[0], err)
	}
	attr := &syscall.ProcAttr{Dir: c.dir, Env: c.env, Files: sio.childFds(), Sys: sys}
	p, err := h.reaper.Start(c.path, c.argv, attr)
	sio.closeChild()
	if err != nil {
		sio.close()
		return nil, nil, startError(c.argv[0], err)
	}
	return p, sio, nil
}

// start starts c, not detachable, as a session served on conn.
func (h *handler) start(conn *websocket.Conn, c *command) (*execSocket, error) {
	p, sio, err := h.spawn(c)
	if err != nil {
		return nil, err
	}
	ss := h.sessions.add(p, c, false, nil)
	h.sessions.watch(ss)
	s := &execSocket{
		conn:    conn,
		log:     h.log.With("pid", p.PID(), "cmd", c.argv[0], "user", c.user, "session", ss.id),
		reaper:  h.reaper,
		proc:    p,
		session: ss.id,
		sio:     sio,
		tty:     c.tty,
		ended:   make(chan struct{}),
		gone:    make(chan struct{}),
	}
	// A terminal always takes input: it is how a person types.
	if sio.stdin != nil {
		s.stdinQ = make(chan []byte, stdinQueue)
	}
	s.log.Info("exec started", "tty", c.tty)
	return s, nil
}

// execSocket is one running exec that is not detachable: a process and the
// socket of its client, which it ends with.
type execSocket struct {
	conn    *websocket.Conn
	log     *slog.Logger
	reaper  *proc.Reaper
	proc    *proc.Process
	session string // the session's id
	sio     *stdio
	tty     bool

	// stdinQ carries stdin from readClient to writeStdin; nil when the
	// process takes none. Closing it means "eof".
	stdinQ   chan []byte
	stdinEOF bool          // "eof" was received; only readClient uses it
	ended    chan struct{} // closed when run returns
	gone     chan struct{} // closed when reading from the client has failed

	outMu   sync.Mutex
	outDone bool // "exit" has been sent: nothing may follow it
}

// errOutputDone is returned when output comes after "exit".
var errOutputDone = errors.New("exit already sent")

// run serves the session until the process exits and its output is sent,
// or the client goes away.
func (s *execSocket) run(ctx context.Context) {
	defer s.sio.close()
	defer close(s.ended)

	if err := s.send(ctx, websocket.MessageText, control(api.ExecControl{Type: api.ExecStarted, PID: s.proc.PID(), Session: s.session}), false); err != nil {
		s.hangup(err)
		return
	}
	go s.readClient(ctx)
	if s.stdinQ != nil {
		go s.writeStdin()
	}
	var pumps sync.WaitGroup
	for _, o := range s.sio.outs {
		pumps.Go(func() { s.pump(ctx, o) })
	}
	pumped := make(chan struct{})
	go func() {
		pumps.Wait()
		close(pumped)
	}()

	select {
	case <-s.proc.Done():
	case <-s.gone:
		s.hangup(errors.New("the client went away"))
		return
	}

	// The main process has exited and all it wrote is in the pipes: read
	// on until EOF, but past the deadline only what is there already.
	var giveUp <-chan time.Time
	deadline := time.Now().Add(outputGrace)
	for _, o := range s.sio.outs {
		if err := o.f.SetReadDeadline(deadline); err != nil {
			// Only if the file is not pollable (pipes and the pty master
			// are): then stop waiting at the deadline.
			s.log.Warn("exec: output has no read deadline", "err", err)
			giveUp = time.After(outputGrace)
		}
	}
	select {
	case <-pumped:
	case <-giveUp:
	case <-s.gone:
		return
	}

	code := proc.ExitCode(s.proc.Status())
	if err := s.send(ctx, websocket.MessageText, control(api.ExecControl{Type: api.ExecExit, ExitCode: &code}), true); err != nil {
		s.log.Info("exec: sending exit", "err", err)
		return
	}
	s.log.Info("exec exited", "exit_code", code)
	// A process that detached itself (setsid, nohup … &) keeps running,
	// as with docker exec: the group is not killed.
	s.conn.Close(websocket.StatusNormalClosure, "")
}

// hangup ends a session whose client has gone before the process exited:
// SIGHUP to its process group, as a terminal's hangup would. Closing the
// terminal's master (when run returns) hangs a tty session up as well.
func (s *execSocket) hangup(why error) {
	s.log.Info("exec hung up", "reason", why)
	if err := s.reaper.Signal(s.proc, syscall.SIGHUP); err != nil && !errors.Is(err, proc.ErrExited) {
		s.log.Warn("exec: hanging up", "err", err)
	}
}

func control(c api.ExecControl) []byte {
	b, _ := json.Marshal(c)
	return b
}

// send writes one message; last marks "exit", after which nothing is sent.
// Writes wait for the client, so a slow client slows the process down
// (its pipe fills) instead of filling the agent's memory.
func (s *execSocket) send(ctx context.Context, typ websocket.MessageType, b []byte, last bool) error {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	if s.outDone {
		return errOutputDone
	}
	s.outDone = last
	return s.conn.Write(ctx, typ, b)
}

// pump forwards one output of the process to the client until EOF, or
// until the read deadline set when the main process exits; it then sends
// what is left in the pipe without waiting for more.
func (s *execSocket) pump(ctx context.Context, o output) {
	buf := make([]byte, maxFrame)
	buf[0] = o.stream
	for {
		n, err := o.f.Read(buf[1:])
		if n > 0 {
			if s.send(ctx, websocket.MessageBinary, buf[:1+n], false) != nil {
				return
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.drain(ctx, o, buf)
			return
		default:
			// EOF; EIO from a terminal nobody holds any more; or closed
			// because the session ended.
			return
		}
	}
}

// drain sends what o holds now, up to drainLimit, without waiting for more.
func (s *execSocket) drain(ctx context.Context, o output, buf []byte) {
	// Clear the deadline: a raw read is refused past it as well.
	if err := o.f.SetReadDeadline(time.Time{}); err != nil {
		return
	}
	rc, err := o.f.SyscallConn()
	if err != nil {
		return
	}
	for sent := 0; sent < drainLimit; {
		var n int
		var readErr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, readErr = unix.Read(int(fd), buf[1:])
				if readErr != unix.EINTR {
					// Done either way: EAGAIN means empty, and
					// returning false would wait for more.
					return true
				}
			}
		})
		if err != nil || readErr != nil || n <= 0 {
			return
		}
		if s.send(ctx, websocket.MessageBinary, buf[:1+n], false) != nil {
			return
		}
		sent += n
	}
}

// readClient reads the client's messages until the socket ends: stdin data
// goes to writeStdin, control messages are acted on at once.
func (s *execSocket) readClient(ctx context.Context) {
	defer close(s.gone)
	for {
		typ, b, err := s.conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if len(b) > 1 && b[0] == api.StreamStdin {
				s.queueStdin(b[1:])
			}
			continue
		}
		var c api.ExecControl
		if err := json.Unmarshal(b, &c); err != nil {
			s.log.Info("exec: ignoring a control message that is not JSON")
			continue
		}
		s.control(c)
	}
}

// queueStdin hands data to writeStdin, waiting while the queue is full.
func (s *execSocket) queueStdin(b []byte) {
	if s.stdinQ == nil || s.stdinEOF {
		return
	}
	select {
	case s.stdinQ <- b:
	case <-s.ended:
	}
}

// control acts on one control message of the client.
func (s *execSocket) control(c api.ExecControl) {
	switch c.Type {
	case api.ExecEOF:
		if s.tty {
			// A terminal has no end of input of its own: type the EOF
			// character (^D), as a person would.
			s.queueStdin([]byte{4})
			return
		}
		if s.stdinQ != nil && !s.stdinEOF {
			s.stdinEOF = true
			close(s.stdinQ)
		}
	case api.ExecSignal:
		sig := signalByName(c.Signal)
		if sig == 0 {
			s.log.Info("exec: ignoring an unknown signal", "signal", c.Signal)
			return
		}
		if err := s.reaper.Signal(s.proc, sig); err != nil && !errors.Is(err, proc.ErrExited) {
			s.log.Warn("exec: delivering a signal", "err", err)
		}
	case api.ExecResize:
		if s.sio.master == nil || c.Rows <= 0 || c.Cols <= 0 || c.Rows > 0xffff || c.Cols > 0xffff {
			return
		}
		if err := proc.SetTerminalSize(s.sio.master, uint16(c.Rows), uint16(c.Cols)); err != nil {
			s.log.Info("exec: resizing", "err", err)
		}
	}
}

// writeStdin writes the queued stdin to the process, and closes it at "eof".
func (s *execSocket) writeStdin() {
	var err error
	for {
		select {
		case b, ok := <-s.stdinQ:
			if !ok {
				s.sio.stdin.Close()
				return
			}
			// Once the process has closed its stdin, drop the rest, as
			// a pipe to a process that stopped reading would.
			if err == nil {
				_, err = s.sio.stdin.Write(b)
			}
		case <-s.ended:
			return
		}
	}
}

// signalByName parses "TERM", "SIGTERM", "term" or "15"; 0 if unknown.
func signalByName(name string) syscall.Signal {
	name = strings.ToUpper(strings.TrimSpace(name))
	if n, err := strconv.Atoi(name); err == nil {
		if n > 0 && n < 65 {
			return syscall.Signal(n)
		}
		return 0
	}
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	return unix.SignalNum(name)
}
