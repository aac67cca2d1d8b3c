package api

// The exec WebSocket: GET /v1/sandboxes/{sandbox}/exec, upgraded.
//
// The client's first message is a text message holding an ExecRequest. Then:
//   - binary messages carry data; their first byte says which stream
//     (StreamStdin from the client, StreamStdout or StreamStderr from the
//     server) and the rest is the data;
//   - text messages carry an ExecControl: from the client "resize", "eof"
//     (stdin is closed) or "signal"; from the server "started" (with the pid
//     and the session's id) and, last, "exit" (with the exit code).
//
// After "exit" the server closes the socket with status 1000. Closing the
// socket before that hangs the command up (SIGHUP), unless the request was
// detachable: then the session runs on and can be attached to (see
// api/session.go for sessions, and the attach socket below). A memory
// checkpoint or a restore of the sandbox closes every exec and attach
// socket with status 1011; a detachable session runs on through it.

// The attach WebSocket: GET /v1/sandboxes/{sandbox}/sessions/{session}/attach,
// upgraded, with optional query parameters offset (where stdout's replay
// starts), stderr_offset (stderr's; offset when not given) and follow
// (see AttachParams). Without them, everything still buffered is replayed,
// then live output follows. The client sends no request: the frames are
// those of the exec socket from the server's "started" on. Before each stream's first byte the server sends an
// ExecOffset control message saying the offset of the byte that follows and
// how many bytes before it, from the offset asked for, were dropped because
// the buffer wrapped; it sends another whenever a client too slow for the
// command falls behind what the buffer holds. Then the buffered output, then
// live output; stdin, "eof", "resize" and "signal" work as on exec; "exit"
// ends the socket (status 1000) once the command has exited and every byte
// was sent. Closing an attach socket leaves the session running. Any number
// of clients may attach at once; each one's stdin goes to the command.

// Stream bytes: the first byte of each binary exec message.
const (
	StreamStdin  byte = 0
	StreamStdout byte = 1
	StreamStderr byte = 2
)

// MaxExecMessage is the largest message a client may send on an exec or
// attach socket (its request, a frame of stdin, a control message): a
// larger one closes the socket with status 1009 (message too big). The
// SDKs send stdin in frames of 16 and 64 KiB.
const MaxExecMessage = 1 << 20

// ExecRequest is the first message of an exec socket.
type ExecRequest struct {
	// Cmd is the program and its arguments; a program without a slash is
	// looked up in PATH.
	Cmd []string `json:"cmd"`
	// Env adds to (and overrides) the sandbox's environment.
	Env map[string]string `json:"env,omitempty"`
	// Dir is the working directory; the user's home when empty.
	Dir string `json:"dir,omitempty"`
	// User is "loam" (the default) or "root", or another user of the image.
	User string `json:"user,omitempty"`
	// TTY gives the command a terminal; stdout and stderr are then one stream.
	TTY  bool `json:"tty,omitempty"`
	Rows int  `json:"rows,omitempty"`
	Cols int  `json:"cols,omitempty"`
	// Stdin tells whether the client will send stdin. Without it, the
	// command's stdin is empty (as </dev/null).
	Stdin bool `json:"stdin,omitempty"`
	// Detachable makes the command a session that runs on when its socket
	// closes, instead of getting SIGHUP; its output goes on into buffers a
	// client can attach to (see api/session.go). It needs an agent of
	// protocol 3: a sandbox restored from an older checkpoint refuses it.
	Detachable bool `json:"detachable,omitempty"`
	// BufferSize is the size, in bytes, of each output buffer of a
	// detachable session: DefaultSessionBuffer when 0, at most
	// MaxSessionBuffer.
	BufferSize int `json:"buffer_size,omitempty"`
}

// ExecControl is a text message on an exec socket.
type ExecControl struct {
	Type string `json:"type"` // "resize", "eof", "signal", "started", "offset", "exit", "error"
	// Rows and Cols for "resize".
	Rows int `json:"rows,omitempty"`
	Cols int `json:"cols,omitempty"`
	// Signal for "signal": a name like "TERM" or "INT".
	Signal string `json:"signal,omitempty"`
	// PID and Session (its id, s-…) for "started".
	PID     int    `json:"pid,omitempty"`
	Session string `json:"session,omitempty"`
	// Stream, Offset and Dropped for "offset" (attach sockets only): the
	// next bytes of Stream start at byte Offset of its output, and Dropped
	// bytes before it, from where the client asked, are no longer buffered.
	Stream  byte  `json:"stream,omitempty"`
	Offset  int64 `json:"offset,omitempty"`
	Dropped int64 `json:"dropped,omitempty"`
	// ExitCode for "exit": the exit status, or 128+N for a command killed by signal N.
	ExitCode *int `json:"exit_code,omitempty"`
	// Error for "error": why the command could not be started.
	Error *Error `json:"error,omitempty"`
}

// Exec control message types.
const (
	ExecResize  = "resize"
	ExecEOF     = "eof"
	ExecSignal  = "signal"
	ExecStarted = "started"
	ExecExit    = "exit"
	ExecError   = "error"
	ExecOffset  = "offset"
)

// WebSocket subprotocols of the API. A client that cannot set an
// Authorization header on a WebSocket (a browser) offers two subprotocols:
// WebSocketProtocol, which the server picks, and WebSocketTokenPrefix
// followed by the API token, which authenticates the request (as
// Kubernetes' base64url.bearer.authorization.k8s.io.<token>).
const (
	WebSocketProtocol    = "loam.v1"
	WebSocketTokenPrefix = "loam.token."
)
