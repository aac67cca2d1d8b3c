package api

import (
	"net/url"
	"strconv"
	"strings"
	"time"
)

// A session is one command run by a sandbox's agent: every exec is one. The
// agent owns it, not a socket: a detachable session runs on with no client
// attached, its output kept in a ring buffer per stream (stdout, stderr; one
// stream with a terminal), addressed by byte offsets that only grow, so a
// client that attaches again can ask for what it has not seen yet.
//
// AttachParams are the query parameters of an attach socket: offset,
// stderr_offset and follow.
type AttachParams struct {
	// Offset is where stdout's replay starts, StderrOffset stderr's
	// (Offset's when nil); nil replays everything still buffered.
	Offset, StderrOffset *int64
	// NoFollow (follow=false) ends the socket once what was buffered when
	// it opened is sent: with "exit" if the session had exited, else with
	// a normal close and no "exit". It is how logs are read.
	NoFollow bool
}

// Query is p as the query of an attach or logs URL: offset,
// stderr_offset and follow=false, each only when set.
func (p AttachParams) Query() url.Values {
	q := url.Values{}
	if p.Offset != nil {
		q.Set("offset", strconv.FormatInt(*p.Offset, 10))
	}
	if p.StderrOffset != nil {
		q.Set("stderr_offset", strconv.FormatInt(*p.StderrOffset, 10))
	}
	if p.NoFollow {
		q.Set("follow", "false")
	}
	return q
}

// Session states.
const (
	SessionRunning = "running"
	SessionExited  = "exited"
)

// Session is an exec session as the API shows it.
type Session struct {
	// ID is "s-" and 12 lowercase letters and digits, unique in its sandbox.
	ID  string   `json:"id"`
	PID int      `json:"pid"`
	Cmd []string `json:"cmd"`
	TTY bool     `json:"tty"`
	// Detachable sessions run on without a socket, and can be attached to.
	Detachable bool `json:"detachable"`
	// State is SessionRunning or SessionExited.
	State string `json:"state"`
	// ExitCode and ExitedAt are null until it has exited. The exit code
	// is the exit status, or 128+N for a command killed by signal N.
	ExitCode  *int       `json:"exit_code"`
	StartedAt time.Time  `json:"started_at"`
	ExitedAt  *time.Time `json:"exited_at"`
}

// SessionList is the body of GET /v1/sandboxes/{sandbox}/sessions: running
// sessions and the newest exited ones (MaxExitedSessions), oldest first.
type SessionList struct {
	Sessions []Session `json:"sessions"`
}

// MaxExitedSessions is how many exited sessions a sandbox keeps listed; a
// newer exit pushes the oldest one out. Running sessions are never dropped,
// and no timeout ever ends one.
const MaxExitedSessions = 100

// SignalSession is the body of POST …/sessions/{session}/signal.
type SignalSession struct {
	// Signal is a name like "TERM", "SIGINT" or a number; it goes to the
	// session's whole process group.
	Signal string `json:"signal"`
}

// Output buffer sizes of a detachable session, per stream.
const (
	DefaultSessionBuffer = 1 << 20
	MaxSessionBuffer     = 64 << 20
)

// ValidSessionID reports whether id has the form of a session id, so that
// nothing else is ever put into a path to an agent.
func ValidSessionID(id string) bool {
	rest, ok := strings.CutPrefix(id, "s-")
	if !ok || len(rest) == 0 || len(rest) > 32 {
		return false
	}
	for _, c := range rest {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
