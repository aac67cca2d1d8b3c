package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"loam.dev/loam/api"
)

// The server's own checkpoints are told apart from the user's by both their
// name and their comment, and from the sandbox's by its inside mark, so
// that pruning them never deletes a checkpoint someone else took.
const (
	guardNamePrefix    = "mcp-"
	guardCommentPrefix = "before mcp "
	// maxCommentDetail bounds what of a command or path goes into a
	// comment (the daemon takes up to 1024 bytes, on one line).
	maxCommentDetail = 200
)

// use checks that the agent may use the sandbox ref (a name or an id) and
// records it in c. With a list of sandboxes configured, a ref not on it is
// looked up, so that an allowed sandbox may also be named by its id.
func (s *Server) use(ctx context.Context, c *call, ref string) error {
	if ref == "" {
		return invalid("sandbox: give the name or id of a sandbox")
	}
	c.sandbox = ref
	if s.allowed(ref, "") {
		return nil
	}
	sb, err := s.c.GetSandbox(ctx, ref)
	if err != nil {
		if errors.Is(err, api.ErrNotFound) {
			return s.refuse(ref)
		}
		return err
	}
	if !s.allowed(sb.Name, sb.ID) {
		return s.refuse(ref)
	}
	return nil
}

// refuse is the error for a sandbox outside the configured list.
func (s *Server) refuse(ref string) error {
	return api.Errorf(api.CodeForbidden, "sandbox %q is not one this MCP server may use; it may use only %s (loam mcp --sandboxes)",
		ref, strings.Join(s.cfg.Sandboxes, ", "))
}

// allowNew checks that the agent may create a sandbox called name.
func (s *Server) allowNew(name string) error {
	if len(s.cfg.Sandboxes) == 0 {
		return nil
	}
	if name == "" {
		return invalid("name: this MCP server may only make sandboxes named %s (loam mcp --sandboxes); give one of those names", strings.Join(s.cfg.Sandboxes, ", "))
	}
	if !s.allowed(name, "") {
		return api.Errorf(api.CodeForbidden, "sandbox %q is not one this MCP server may make; it may make only %s (loam mcp --sandboxes)",
			name, strings.Join(s.cfg.Sandboxes, ", "))
	}
	return nil
}

// before checks that the agent may use sandbox ref, then, when the policy
// asks for one before a call of c's kind, takes a checkpoint of it and
// records its id in c. what describes the call for the checkpoint's
// comment. When the checkpoint cannot be taken the call is refused: an
// agent's step that could not be undone is not taken.
func (s *Server) before(ctx context.Context, c *call, ref, what string) error {
	if err := s.use(ctx, c, ref); err != nil {
		return err
	}
	c.detail = what
	if !s.checkpoints(c.kind) {
		return nil
	}
	id, err := s.guardCheckpoint(ctx, ref, c.tool, what)
	if err != nil {
		return fmt.Errorf("taking the checkpoint before %s (loam mcp --checkpoint-before=%s), so the call was not made: %w",
			c.tool, s.cfg.CheckpointBefore, err)
	}
	c.checkpoint = id
	return nil
}

// checkpoints reports whether the policy takes a checkpoint before a call of
// kind k.
func (s *Server) checkpoints(k kind) bool {
	switch s.cfg.CheckpointBefore {
	case CheckpointExec:
		return k == runs || k == changes
	case CheckpointWrite:
		return k == changes
	}
	return false
}

// guardCheckpoint takes one of the server's checkpoints of sandbox and
// prunes the older ones beyond CheckpointKeep. When the daemon's limit
// stops it, the oldest of the server's own makes room, once.
func (s *Server) guardCheckpoint(ctx context.Context, sandbox, tool, what string) (string, error) {
	req := api.CreateCheckpoint{
		Name:    guardName(),
		Comment: guardComment(tool, what),
		Memory:  new(s.cfg.CheckpointMemory),
	}
	cp, err := s.c.CreateCheckpoint(ctx, sandbox, req)
	if errors.Is(err, api.ErrLimit) && s.cfg.CheckpointKeep > 0 {
		own, lerr := s.guardCheckpoints(ctx, sandbox)
		if lerr != nil || len(own) == 0 {
			return "", err
		}
		if derr := s.c.DeleteCheckpoint(ctx, sandbox, own[0].ID); derr != nil && !errors.Is(derr, api.ErrNotFound) {
			return "", err
		}
		s.log.Info("deleted the oldest checkpoint of loam mcp to make room", "sandbox", sandbox, "checkpoint", own[0].ID)
		cp, err = s.c.CreateCheckpoint(ctx, sandbox, req)
	}
	if err != nil {
		return "", err
	}
	if s.cfg.CheckpointKeep > 0 {
		s.prune(ctx, sandbox)
	}
	return cp.ID, nil
}

// prune deletes the server's own checkpoints of sandbox beyond the newest
// CheckpointKeep. A failure is logged, not returned: the call the
// checkpoint was taken for may go on.
func (s *Server) prune(ctx context.Context, sandbox string) {
	own, err := s.guardCheckpoints(ctx, sandbox)
	if err != nil {
		s.log.Warn("listing checkpoints to prune", "sandbox", sandbox, "error", err.Error())
		return
	}
	for len(own) > s.cfg.CheckpointKeep {
		// Two calls at once may prune the same one: gone is as good.
		if err := s.c.DeleteCheckpoint(ctx, sandbox, own[0].ID); err != nil && !errors.Is(err, api.ErrNotFound) {
			s.log.Warn("pruning a checkpoint of loam mcp", "sandbox", sandbox, "checkpoint", own[0].ID, "error", err.Error())
			return
		}
		own = own[1:]
	}
}

// guardCheckpoints lists the checkpoints of sandbox that the server took,
// oldest first. Those the sandbox took of itself are never among them,
// whatever their names: a sandbox that named a few as the server names its
// own must not get the server's real ones pruned in their place (and the
// daemon counts them against a share of their own, not the owner's).
func (s *Server) guardCheckpoints(ctx context.Context, sandbox string) ([]api.Checkpoint, error) {
	cps, err := s.c.ListCheckpoints(ctx, sandbox)
	if err != nil {
		return nil, err
	}
	var own []api.Checkpoint
	for _, cp := range cps {
		if !cp.Auto && !cp.Inside && strings.HasPrefix(cp.Name, guardNamePrefix) && strings.HasPrefix(cp.Comment, guardCommentPrefix) {
			own = append(own, cp)
		}
	}
	return own, nil
}

// clip cuts s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// guardName is a fresh name for one of the server's checkpoints.
func guardName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return guardNamePrefix + hex.EncodeToString(b)
}

// guardComment is the comment of the checkpoint before a call of tool:
// "before mcp exec: make test". It is one line, as the daemon requires.
func guardComment(tool, what string) string {
	verb := tool
	if tool == "run_command" {
		verb = "exec"
	}
	what = strings.Join(strings.Fields(what), " ")
	what = clip(what, maxCommentDetail)
	if what == "" {
		return guardCommentPrefix + verb
	}
	return guardCommentPrefix + verb + ": " + what
}
