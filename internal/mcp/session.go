package mcp

import (
	"context"
	"errors"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// DefaultReadBytes and MaxReadBytes bound what read_session and read_file
// return from one call; the agent reads on from the offset they give back.
const (
	DefaultReadBytes = 64 << 10
	MaxReadBytes     = 1 << 20
)

// Session is a detachable session as the tools show it.
type Session struct {
	ID        string   `json:"id"`
	PID       int      `json:"pid"`
	Cmd       []string `json:"cmd"`
	State     string   `json:"state" jsonschema:"running or exited"`
	ExitCode  *int     `json:"exit_code,omitempty" jsonschema:"the exit status once exited, 128+N for a session killed by signal N"`
	StartedAt string   `json:"started_at"`
}

func sessionOf(s *api.Session) Session {
	return Session{ID: s.ID, PID: s.PID, Cmd: s.Cmd, State: s.State, ExitCode: s.ExitCode,
		StartedAt: s.StartedAt.UTC().Format(time.RFC3339)}
}

// StartSessionOutput is the output of start_session.
type StartSessionOutput struct {
	Session    Session `json:"session"`
	Checkpoint string  `json:"checkpoint,omitempty" jsonschema:"the checkpoint taken before the session started: restore_checkpoint to it to undo what the session does"`
}

// ListSessionsOutput is the output of list_sessions.
type ListSessionsOutput struct {
	Sessions []Session `json:"sessions"`
}

// ReadSessionInput is the input of read_session.
type ReadSessionInput struct {
	Sandbox      string `json:"sandbox" jsonschema:"the sandbox's name or id"`
	Session      string `json:"session" jsonschema:"the session's id (s-…), from start_session or list_sessions"`
	Offset       *int64 `json:"offset,omitempty" jsonschema:"the stdout offset to read from: next_offset of the previous read; from the oldest byte still kept when absent"`
	StderrOffset *int64 `json:"stderr_offset,omitempty" jsonschema:"the stderr offset to read from: next_stderr_offset of the previous read"`
	MaxBytes     int    `json:"max_bytes,omitempty" jsonschema:"the most bytes of each stream to return: 65536 when 0, at most 1048576"`
}

// ReadSessionOutput is the output of read_session.
type ReadSessionOutput struct {
	Session          Session `json:"session"`
	Stdout           string  `json:"stdout"`
	Stderr           string  `json:"stderr"`
	NextOffset       int64   `json:"next_offset" jsonschema:"give it as offset to read on from here"`
	NextStderrOffset int64   `json:"next_stderr_offset" jsonschema:"give it as stderr_offset to read on from here"`
	Dropped          int64   `json:"dropped,omitempty" jsonschema:"bytes between the offsets asked for and the oldest still kept, lost from the session's buffers"`
	More             bool    `json:"more,omitempty" jsonschema:"more output is buffered than max_bytes let through: read again from the next offsets"`
}

// SessionRef names a session, for kill_session.
type SessionRef struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name or id"`
	Session string `json:"session" jsonschema:"the session's id (s-…)"`
	Signal  string `json:"signal,omitempty" jsonschema:"a signal (TERM, INT, HUP, 9, …) to send to the session's process group; when empty the whole process tree is killed and the session forgotten"`
}

// KillSessionOutput is the output of kill_session.
type KillSessionOutput struct {
	Session    string `json:"session"`
	Signal     string `json:"signal" jsonschema:"the signal sent, or KILL for a session killed and forgotten"`
	Checkpoint string `json:"checkpoint,omitempty" jsonschema:"the checkpoint taken before the kill"`
}

func (s *Server) addSessionTools() {
	addTool(s, tool{name: "start_session", title: "Start a session", kind: runs, destructive: true,
		desc: "Start a command in a sandbox as a detachable session, which runs on without the agent (a server, a long build). " +
			"Read its output with read_session, stop it with kill_session."},
		func(ctx context.Context, c *call, in CommandSpec) (StartSessionOutput, error) {
			argv, err := in.argv()
			if err != nil {
				return StartSessionOutput{}, err
			}
			if err := in.check(); err != nil {
				return StartSessionOutput{}, err
			}
			if err := s.before(ctx, c, in.Sandbox, in.describe()); err != nil {
				return StartSessionOutput{}, err
			}
			sess, err := s.c.CreateSession(ctx, in.Sandbox, api.ExecRequest{Cmd: argv, Env: in.Env, Dir: in.Dir, User: in.User, Detachable: true})
			if err != nil {
				return StartSessionOutput{}, err
			}
			c.detail = sess.ID + ": " + c.detail
			return StartSessionOutput{Session: sessionOf(sess), Checkpoint: c.checkpoint}, nil
		})

	addTool(s, tool{name: "list_sessions", title: "List sessions", kind: reads,
		desc: "List a sandbox's sessions: the running ones and the last exited ones, with their exit codes."},
		func(ctx context.Context, c *call, in SandboxRef) (ListSessionsOutput, error) {
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return ListSessionsOutput{}, err
			}
			list, err := s.c.ListSessions(ctx, in.Sandbox)
			if err != nil {
				return ListSessionsOutput{}, err
			}
			out := ListSessionsOutput{Sessions: make([]Session, 0, len(list))}
			for i := range list {
				out.Sessions = append(out.Sessions, sessionOf(&list[i]))
			}
			return out, nil
		})

	addTool(s, tool{name: "read_session", title: "Read a session's output", kind: reads,
		desc: "Read what a session wrote since the given offsets, without waiting, and whether it still runs. " +
			"Pass back next_offset and next_stderr_offset to read on."},
		func(ctx context.Context, c *call, in ReadSessionInput) (ReadSessionOutput, error) {
			if err := checkSession(in.Session); err != nil {
				return ReadSessionOutput{}, err
			}
			limit, err := readLimit(in.MaxBytes)
			if err != nil {
				return ReadSessionOutput{}, err
			}
			if (in.Offset != nil && *in.Offset < 0) || (in.StderrOffset != nil && *in.StderrOffset < 0) {
				return ReadSessionOutput{}, invalid("offset and stderr_offset are byte offsets: 0 or more")
			}
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return ReadSessionOutput{}, err
			}
			c.detail = in.Session
			return s.readSession(ctx, in, limit)
		})

	addTool(s, tool{name: "kill_session", title: "Kill a session", kind: changes, destructive: true,
		desc: "Kill a session's whole process tree and forget it, or with signal send it that signal."},
		func(ctx context.Context, c *call, in SessionRef) (KillSessionOutput, error) {
			if err := checkSession(in.Session); err != nil {
				return KillSessionOutput{}, err
			}
			what := in.Session
			if in.Signal != "" {
				what += " " + in.Signal
			}
			if err := s.before(ctx, c, in.Sandbox, what); err != nil {
				return KillSessionOutput{}, err
			}
			out := KillSessionOutput{Session: in.Session, Signal: in.Signal, Checkpoint: c.checkpoint}
			if in.Signal == "" {
				out.Signal = "KILL"
				return out, s.c.DeleteSession(ctx, in.Sandbox, in.Session)
			}
			return out, s.c.SignalSession(ctx, in.Sandbox, in.Session, in.Signal)
		})
}

// checkSession checks the shape of a session id before it goes into a path.
func checkSession(id string) error {
	if !api.ValidSessionID(id) {
		return invalid("session %q: a session id is s- and lowercase letters and digits, as start_session and list_sessions give it", id)
	}
	return nil
}

// readLimit is max_bytes, checked, with its default.
func readLimit(n int) (int, error) {
	switch {
	case n == 0:
		return DefaultReadBytes, nil
	case n < 0 || n > MaxReadBytes:
		return 0, invalid("max_bytes %d: give 1 to %d", n, MaxReadBytes)
	}
	return n, nil
}

// readSession reads what the session buffered from the offsets, up to limit
// bytes a stream, and where the next read starts.
func (s *Server) readSession(ctx context.Context, in ReadSessionInput, limit int) (ReadSessionOutput, error) {
	stdout := &window{max: limit}
	stderr := &window{max: limit}
	if in.Offset != nil {
		stdout.pos = *in.Offset
	}
	stderr.pos = stdout.pos
	if in.StderrOffset != nil {
		stderr.pos = *in.StderrOffset
	}
	_, err := s.c.Attach(ctx, in.Sandbox, in.Session, client.AttachOptions{
		Offset: in.Offset, StderrOffset: in.StderrOffset, NoFollow: true,
		Stdout: stdout, Stderr: stderr,
		OnOffset: func(stream byte, offset, dropped int64) {
			w := stdout
			if stream == api.StreamStderr {
				w = stderr
			}
			w.pos, w.dropped = offset, w.dropped+dropped
		},
	})
	more := errors.Is(err, errFull)
	if err != nil && !more {
		return ReadSessionOutput{}, err
	}
	sess, err := s.c.GetSession(ctx, in.Sandbox, in.Session)
	if err != nil {
		return ReadSessionOutput{}, err
	}
	return ReadSessionOutput{
		Session: sessionOf(sess), Stdout: string(stdout.buf), Stderr: string(stderr.buf),
		NextOffset: stdout.pos, NextStderrOffset: stderr.pos,
		Dropped: stdout.dropped + stderr.dropped, More: more,
	}, nil
}

// errFull stops an attach once a window holds all a read may return.
var errFull = errors.New("the read's max_bytes is reached")

// window takes up to max bytes of one stream and keeps the offset the next
// read starts from.
type window struct {
	max     int
	buf     []byte
	pos     int64
	dropped int64
}

func (w *window) Write(p []byte) (int, error) {
	room := w.max - len(w.buf)
	if len(p) > room {
		w.buf = append(w.buf, p[:room]...)
		w.pos += int64(room)
		return room, errFull
	}
	w.buf = append(w.buf, p...)
	w.pos += int64(len(p))
	return len(p), nil
}
