package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Limits of run_command.
const (
	// DefaultTimeout is how long a command may run when the call gives no
	// timeout_seconds.
	DefaultTimeout = 60 * time.Second
	// MaxTimeout is the longest timeout_seconds a call may give: longer
	// work belongs in a session, which no call waits for.
	MaxTimeout = time.Hour
	// maxOutput is how much of each stream a call returns: the end of it,
	// where a failing command says why.
	maxOutput = 64 << 10
	// killTimeout bounds the kill of a command that ran out of time.
	killTimeout = 10 * time.Second
)

// CommandSpec is how the tools that run something take it: a shell line or an
// argument vector, and where and as whom it runs.
type CommandSpec struct {
	Sandbox string            `json:"sandbox" jsonschema:"the sandbox's name or id"`
	Command string            `json:"command,omitempty" jsonschema:"a shell command line, run with /bin/sh -c; give command or argv"`
	Argv    []string          `json:"argv,omitempty" jsonschema:"the program and its arguments, run without a shell; give command or argv"`
	Dir     string            `json:"dir,omitempty" jsonschema:"the working directory, an absolute path; the user's home when empty"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"environment variables added to the sandbox's"`
	User    string            `json:"user,omitempty" jsonschema:"the user to run as: loam when empty, or root, or another user of the image"`
}

// argv is the program and arguments cmd describes, or an error that says
// what is wrong with it.
func (cmd CommandSpec) argv() ([]string, error) {
	switch {
	case cmd.Command != "" && len(cmd.Argv) > 0:
		return nil, invalid("give command (a shell line) or argv (a program and its arguments), not both")
	case cmd.Command != "":
		return []string{"/bin/sh", "-c", cmd.Command}, nil
	case len(cmd.Argv) > 0:
		if cmd.Argv[0] == "" {
			return nil, invalid("argv: the program (argv[0]) is empty")
		}
		return cmd.Argv, nil
	}
	return nil, invalid("give command (a shell line) or argv (a program and its arguments)")
}

// check checks the fields other than the command.
func (cmd CommandSpec) check() error {
	if cmd.Dir != "" {
		if err := api.CheckFilePath("dir", cmd.Dir); err != nil {
			return err
		}
	}
	return api.CheckFileUser(cmd.User)
}

// describe is the command as a log line and a checkpoint comment show it.
func (cmd CommandSpec) describe() string {
	if cmd.Command != "" {
		return cmd.Command
	}
	return strings.Join(cmd.Argv, " ")
}

// RunInput is the input of run_command.
type RunInput struct {
	CommandSpec
	Stdin          string `json:"stdin,omitempty" jsonschema:"text given to the command's stdin, which is empty otherwise"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"how long the command may run before it and its children are killed: 60 when 0, at most 3600"`
}

// RunOutput is the output of run_command.
type RunOutput struct {
	ExitCode int    `json:"exit_code" jsonschema:"the exit status, or 128+N for a command killed by signal N"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// StdoutDropped and StderrDropped count the bytes cut from the start
	// of a stream longer than the tool returns.
	StdoutDropped int64  `json:"stdout_dropped,omitempty" jsonschema:"bytes cut from the start of stdout, which was longer than the tool returns (64 KiB)"`
	StderrDropped int64  `json:"stderr_dropped,omitempty" jsonschema:"bytes cut from the start of stderr"`
	Checkpoint    string `json:"checkpoint,omitempty" jsonschema:"the checkpoint taken before the command: restore_checkpoint to it to undo the command"`
}

func (s *Server) addExecTools() {
	addTool(s, tool{name: "run_command", title: "Run a command", kind: runs, destructive: true,
		desc: "Run a command in a sandbox and wait for it: its exit code, stdout and stderr (the last 64 KiB of each). " +
			"It is killed, with its children, after timeout_seconds (60 by default). For servers and other long work, use start_session."},
		func(ctx context.Context, c *call, in RunInput) (RunOutput, error) {
			argv, err := in.argv()
			if err != nil {
				return RunOutput{}, err
			}
			if err := in.check(); err != nil {
				return RunOutput{}, err
			}
			timeout := DefaultTimeout
			switch {
			case in.TimeoutSeconds < 0 || time.Duration(in.TimeoutSeconds)*time.Second > MaxTimeout:
				return RunOutput{}, invalid("timeout_seconds %d: give 1 to %d (or 0 for %d)", in.TimeoutSeconds, int(MaxTimeout.Seconds()), int(DefaultTimeout.Seconds()))
			case in.TimeoutSeconds > 0:
				timeout = time.Duration(in.TimeoutSeconds) * time.Second
			}
			if err := s.before(ctx, c, in.Sandbox, in.describe()); err != nil {
				return RunOutput{}, err
			}
			out, err := s.run(ctx, in, argv, timeout)
			out.Checkpoint = c.checkpoint
			return out, err
		})
}

// run runs argv as a detachable session, so that a memory checkpoint taken
// meanwhile does not end it (the stream is attached again where it stopped)
// and so that when its time is up the whole of it, children included, can be
// killed rather than only hung up.
func (s *Server) run(ctx context.Context, in RunInput, argv []string, timeout time.Duration) (RunOutput, error) {
	runCtx, cancel := context.WithTimeoutCause(ctx, timeout, errTimeout)
	defer cancel()
	stdout, stderr := &tail{max: maxOutput}, &tail{max: maxOutput}
	var session string
	opts := client.ExecOptions{
		Cmd: argv, Env: in.Env, Dir: in.Dir, User: in.User,
		Stdout: stdout, Stderr: stderr, Detachable: true,
		Started: func(_ int, id string) { session = id },
	}
	if in.Stdin != "" {
		opts.Stdin = strings.NewReader(in.Stdin)
	}
	code, err := s.c.Exec(runCtx, in.Sandbox, opts)
	for err != nil && errors.Is(err, client.ErrInterrupted) && session != "" && runCtx.Err() == nil {
		// A checkpoint or restore of the sandbox ended the stream; the
		// session runs on (or, after a restore, is gone: attach says so).
		outOff, errOff := stdout.total, stderr.total
		code, err = s.c.Attach(runCtx, in.Sandbox, session, client.AttachOptions{
			Offset: &outOff, StderrOffset: &errOff, Stdout: stdout, Stderr: stderr,
		})
	}
	out := RunOutput{ExitCode: code, Stdout: stdout.String(), Stderr: stderr.String(),
		StdoutDropped: stdout.dropped(), StderrDropped: stderr.dropped()}
	if err == nil {
		return out, nil
	}
	if runCtx.Err() != nil && session != "" {
		// Out of time, or the call was cancelled: the session must not
		// run on unseen.
		killCtx, cancelKill := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
		defer cancelKill()
		if kerr := s.c.DeleteSession(killCtx, in.Sandbox, session); kerr != nil && !errors.Is(kerr, api.ErrNotFound) {
			s.log.Warn("killing a command that ran out of time", "sandbox", in.Sandbox, "session", session, "error", kerr.Error())
		}
	}
	if errors.Is(context.Cause(runCtx), errTimeout) {
		return out, fmt.Errorf("the command did not finish within %s and was killed with its children; what it wrote until then:\nstdout:\n%s\nstderr:\n%s",
			timeout, out.Stdout, out.Stderr)
	}
	return out, err
}

// errTimeout is the cause of a command's context when its time is up.
var errTimeout = errors.New("the command's time is up")

// tail keeps the last max bytes written to it and counts the rest.
type tail struct {
	max   int
	buf   []byte
	total int64
}

func (t *tail) Write(p []byte) (int, error) {
	t.total += int64(len(p))
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string { return string(t.buf) }

// dropped is how many bytes were cut from the start.
func (t *tail) dropped() int64 { return t.total - int64(len(t.buf)) }
