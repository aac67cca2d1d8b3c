package api

// The exec WebSocket: GET /v1/sandboxes/{sandbox}/exec, upgraded.
//
// The client's first message is a text message holding an ExecRequest. Then:
//   - binary messages carry data; their first byte says which stream
//     (StreamStdin from the client, StreamStdout or StreamStderr from the
//     server) and the rest is the data;
//   - text messages carry an ExecControl: from the client "resize", "eof"
//     (stdin is closed) or "signal"; from the server "started" (with the pid)
//     and, last, "exit" (with the exit code).
//
// After "exit" the server closes the socket with status 1000. Closing the
// socket before that hangs the command up (SIGHUP). A memory checkpoint or a
// restore of the sandbox closes every exec socket with status 1011.

// Stream bytes: the first byte of each binary exec message.
const (
	StreamStdin  byte = 0
	StreamStdout byte = 1
	StreamStderr byte = 2
)

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
}

// ExecControl is a text message on an exec socket.
type ExecControl struct {
	Type string `json:"type"` // "resize", "eof", "signal", "started", "exit", "error"
	// Rows and Cols for "resize".
	Rows int `json:"rows,omitempty"`
	Cols int `json:"cols,omitempty"`
	// Signal for "signal": a name like "TERM" or "INT".
	Signal string `json:"signal,omitempty"`
	// PID for "started".
	PID int `json:"pid,omitempty"`
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
)
