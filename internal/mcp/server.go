// Package mcp is loam's Model Context Protocol server: it offers an AI agent
// tools to create, list and delete sandboxes, run commands, start, read and
// kill detachable sessions, read and write files, checkpoint, restore and
// fork, all through the Go SDK (package client), as any other client does.
//
// What sets it apart are its guardrails, set per server (Config): a
// checkpoint taken before each mutating tool call, so that any step of an
// agent can be undone (its id comes back in the tool's result and in the
// log); a list of the only sandboxes the agent may touch; and a read-only
// mode that offers no tool that changes anything. Every tool call is logged,
// with the checkpoint taken before it.
//
// Tool errors, whether the agent's arguments were wrong or the daemon
// refused, come back as tool results with IsError set and a message that
// says what to do; a call never takes the server down.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Checkpointing says before which tool calls the server takes a checkpoint.
// The strings are the values of loam mcp --checkpoint-before.
type Checkpointing string

// The checkpointing policies.
const (
	// CheckpointNever takes no checkpoint.
	CheckpointNever Checkpointing = "never"
	// CheckpointWrite takes one before every call that changes an existing
	// sandbox other than by running a command: write_file, remove_file,
	// kill_session.
	CheckpointWrite Checkpointing = "write"
	// CheckpointExec takes one before all of CheckpointWrite's calls and
	// before every command too: run_command, start_session.
	CheckpointExec Checkpointing = "exec"
)

// ParseCheckpointing reads a --checkpoint-before value.
func ParseCheckpointing(s string) (Checkpointing, error) {
	switch c := Checkpointing(s); c {
	case CheckpointNever, CheckpointWrite, CheckpointExec:
		return c, nil
	}
	return "", fmt.Errorf("checkpoint-before %q: give exec, write or never", s)
}

// DefaultCheckpointKeep is how many of its own checkpoints the server keeps
// per sandbox unless told otherwise: few enough to leave room under the
// daemon's per-sandbox limit (loam serve --checkpoint-limit, 10 by default)
// for the user's own.
const DefaultCheckpointKeep = 5

// Config is a server's guardrails. The zero value offers every tool on every
// sandbox and takes no checkpoint.
type Config struct {
	// CheckpointBefore says before which calls a checkpoint is taken; ""
	// is CheckpointNever.
	CheckpointBefore Checkpointing
	// CheckpointMemory makes those checkpoints memory checkpoints (memory
	// and disk: restoring one resumes the sandbox's processes) instead of
	// disk-only ones. A memory checkpoint pauses the sandbox while it is
	// taken and ends the exec streams open on it.
	CheckpointMemory bool
	// CheckpointKeep is how many of the checkpoints it took itself the
	// server keeps per sandbox; older ones are deleted once a new one is
	// taken. 0 keeps them all (the daemon's limit then stops the calls).
	CheckpointKeep int
	// Sandboxes, when not empty, are the only sandboxes (by name or id) the
	// agent may see or touch; it may create (or fork to) only sandboxes of
	// these names.
	Sandboxes []string
	// ReadOnly offers only the tools that change nothing.
	ReadOnly bool
	// Logger receives one record per tool call; slog.Default when nil.
	// With the stdio transport it must not write to stdout.
	Logger *slog.Logger
	// Version is the server's version as it tells clients.
	Version string
}

// Server is loam's MCP server: the tools, bound to one daemon through c,
// under one Config. It is safe for concurrent use; one Server serves any
// number of sessions.
type Server struct {
	c   *client.Client
	cfg Config
	log *slog.Logger
	mcp *sdk.Server
}

// New returns a Server that acts on the daemon c talks to, with cfg's
// guardrails.
func New(c *client.Client, cfg Config) (*Server, error) {
	if cfg.CheckpointBefore == "" {
		cfg.CheckpointBefore = CheckpointNever
	}
	if _, err := ParseCheckpointing(string(cfg.CheckpointBefore)); err != nil {
		return nil, err
	}
	if cfg.CheckpointKeep < 0 {
		return nil, fmt.Errorf("checkpoint-keep %d: give 0 (keep all) or more", cfg.CheckpointKeep)
	}
	// "a, b" on a command line means a and b.
	names := make([]string, 0, len(cfg.Sandboxes))
	for _, name := range cfg.Sandboxes {
		name = strings.TrimSpace(name)
		if name == "" {
			return nil, errors.New("sandboxes: an empty name in the list")
		}
		names = append(names, name)
	}
	cfg.Sandboxes = names
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	s := &Server{c: c, cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.mcp = sdk.NewServer(&sdk.Implementation{Name: "loam", Title: "loam sandboxes", Version: cfg.Version},
		&sdk.ServerOptions{Instructions: s.instructions(), Capabilities: &sdk.ServerCapabilities{}})
	s.mcp.AddReceivingMiddleware(s.logCalls)
	s.addSandboxTools()
	s.addExecTools()
	s.addSessionTools()
	s.addFileTools()
	s.addCheckpointTools()
	return s, nil
}

// MCP is the SDK server, for transports other than those Run and Handler
// give, and for tests (an in-memory transport).
func (s *Server) MCP() *sdk.Server { return s.mcp }

// Run serves one session over t (such as &sdk.StdioTransport{}) until the
// client goes or ctx ends.
func (s *Server) Run(ctx context.Context, t sdk.Transport) error {
	s.log.Info("serving MCP", "checkpoint_before", string(s.cfg.CheckpointBefore),
		"checkpoint_memory", s.cfg.CheckpointMemory, "sandboxes", strings.Join(s.cfg.Sandboxes, ","), "read_only", s.cfg.ReadOnly)
	if err := s.mcp.Run(ctx, t); err != nil && ctx.Err() == nil {
		return fmt.Errorf("serving MCP: %w", err)
	}
	return nil
}

// instructions tell the agent what the server is and what its guardrails are.
func (s *Server) instructions() string {
	var b strings.Builder
	b.WriteString("loam runs sandboxes: isolated Linux machines (gVisor) that can be checkpointed, restored in place and forked. ")
	b.WriteString("Paths are absolute paths inside the sandbox; commands run as the user loam unless a user is given.")
	switch s.cfg.CheckpointBefore {
	case CheckpointExec:
		b.WriteString(" A checkpoint is taken before every command and every change; its id comes back as \"checkpoint\": restore_checkpoint to it to undo the step.")
	case CheckpointWrite:
		b.WriteString(" A checkpoint is taken before every file write or removal and every session kill; its id comes back as \"checkpoint\": restore_checkpoint to it to undo the step.")
	}
	if len(s.cfg.Sandboxes) > 0 {
		b.WriteString(" Only these sandboxes may be used: " + strings.Join(s.cfg.Sandboxes, ", ") + ".")
	}
	if s.cfg.ReadOnly {
		b.WriteString(" This server is read-only: it offers only tools that change nothing.")
	}
	return b.String()
}

// kind is what a tool does to sandboxes, which decides whether it is
// offered read-only and whether a checkpoint comes before it.
type kind int

const (
	// reads changes nothing; the only kind offered under ReadOnly.
	reads kind = iota
	// runs runs a command in an existing sandbox: a checkpoint comes
	// before it under CheckpointExec.
	runs
	// changes changes an existing sandbox's files or processes other than
	// by running a command: a checkpoint comes before it under
	// CheckpointExec and CheckpointWrite.
	changes
	// manages makes, deletes, checkpoints or restores sandboxes. No
	// checkpoint of the server's comes before it: a new sandbox or fork has
	// nothing to undo, a checkpoint is one, a restore keeps its own (auto-N,
	// which its result names), and a deleted sandbox takes its checkpoints
	// with it.
	manages
)

// tool describes one tool for addTool.
type tool struct {
	name  string
	title string
	desc  string
	kind  kind
	// destructive marks a tool whose change cannot be undone by the
	// server's checkpoints (annotations.destructiveHint).
	destructive bool
}

// call is one tool call as it is logged: filled in by the handler and by
// the guard as the call goes.
type call struct {
	tool       string
	kind       kind
	sandbox    string
	checkpoint string
	detail     string
}

// addTool registers a tool with the handler h, unless the server is
// read-only and the tool changes something. Around h it catches panics and
// turns errors into tool errors; logCalls logs the call.
func addTool[In, Out any](s *Server, t tool, h func(context.Context, *call, In) (Out, error)) {
	if s.cfg.ReadOnly && t.kind != reads {
		return
	}
	ann := &sdk.ToolAnnotations{Title: t.title, ReadOnlyHint: t.kind == reads, OpenWorldHint: new(false)}
	if t.kind != reads {
		ann.DestructiveHint = new(t.destructive)
	}
	sdk.AddTool(s.mcp, &sdk.Tool{Name: t.name, Title: t.title, Description: t.desc, Annotations: ann},
		func(ctx context.Context, _ *sdk.CallToolRequest, in In) (*sdk.CallToolResult, Out, error) {
			c, _ := ctx.Value(callKey{}).(*call)
			if c == nil {
				c = &call{}
			}
			c.tool, c.kind = t.name, t.kind
			out, err := safely(ctx, s.log, c, in, h)
			if err != nil {
				msg := message(err)
				if c.checkpoint != "" {
					// The call may have done part of its work (a command
					// that timed out): the agent can still undo it.
					msg += fmt.Sprintf(" (checkpoint %s was taken before the call: restore_checkpoint to it to undo what the call did)", c.checkpoint)
				}
				var zero Out
				return nil, zero, errors.New(msg)
			}
			return nil, out, nil
		})
}

// safely runs h, turning a panic into an error: one bad call must not take
// down the agent's whole session. The stack goes to the log.
func safely[In, Out any](ctx context.Context, log *slog.Logger, c *call, in In, h func(context.Context, *call, In) (Out, error)) (out Out, err error) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("tool call panicked", "tool", c.tool, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("internal error in %s: %v", c.tool, r)
		}
	}()
	return h(ctx, c, in)
}

// callKey finds a tool call's record in its context.
type callKey struct{}

// logCalls is the server's middleware that logs every tool call once it is
// answered, whether its handler ran or the SDK refused its arguments first,
// with what the handler recorded (sandbox, checkpoint).
func (s *Server) logCalls(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		c := &call{}
		if p, ok := req.GetParams().(*sdk.CallToolParamsRaw); ok {
			c.tool = p.Name
		}
		start := time.Now()
		res, err := next(context.WithValue(ctx, callKey{}, c), method, req)
		failure := ""
		if err != nil {
			failure = err.Error()
		} else if r, ok := res.(*sdk.CallToolResult); ok && r.IsError {
			failure = resultText(r)
		}
		s.logCall(c, time.Since(start), failure)
		return res, err
	}
}

// logCall writes the one record of a tool call; failure is its error, ""
// when it succeeded.
func (s *Server) logCall(c *call, d time.Duration, failure string) {
	attrs := []any{"tool", c.tool, "duration", d.Round(time.Millisecond)}
	if c.sandbox != "" {
		attrs = append(attrs, "sandbox", c.sandbox)
	}
	if c.detail != "" {
		attrs = append(attrs, "detail", c.detail)
	}
	if c.checkpoint != "" {
		attrs = append(attrs, "checkpoint", c.checkpoint)
	}
	if failure != "" {
		s.log.Warn("tool call failed", append(attrs, "error", failure)...)
		return
	}
	s.log.Info("tool call", attrs...)
}

// resultText is the text of a result's content.
func resultText(r *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if t, ok := c.(*sdk.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

// message is what the agent reads for err: the whole chain, which names
// what was being done and, for an API error, the daemon's own message.
func message(err error) string {
	if errors.Is(err, api.ErrUnauthorized) {
		return err.Error() + " (the token loam mcp was started with is not the daemon's)"
	}
	return err.Error()
}

// invalid is an error in the agent's arguments.
func invalid(format string, args ...any) error {
	return api.Errorf(api.CodeInvalid, format, args...)
}

// allowed reports whether the configuration lets the agent use a sandbox
// called name with id id.
func (s *Server) allowed(name, id string) bool {
	if len(s.cfg.Sandboxes) == 0 {
		return true
	}
	return slices.Contains(s.cfg.Sandboxes, name) || (id != "" && slices.Contains(s.cfg.Sandboxes, id))
}
