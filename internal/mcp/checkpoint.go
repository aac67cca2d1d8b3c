package mcp

import (
	"context"
	"time"

	"loam.dev/loam/api"
)

// Checkpoint is a checkpoint as the tools show it.
type Checkpoint struct {
	ID        string `json:"id" jsonschema:"v1, v2, … for checkpoints taken on request; auto-1, auto-2, … for those kept before a restore"`
	Name      string `json:"name,omitempty"`
	Comment   string `json:"comment,omitempty"`
	Memory    bool   `json:"memory" jsonschema:"true: memory and disk, restoring it resumes the processes; false: disk only, restoring it boots fresh"`
	Auto      bool   `json:"auto,omitempty"`
	CreatedAt string `json:"created_at"`
}

func checkpointOf(cp *api.Checkpoint) Checkpoint {
	return Checkpoint{ID: cp.ID, Name: cp.Name, Comment: cp.Comment, Memory: cp.Memory, Auto: cp.Auto,
		CreatedAt: cp.CreatedAt.UTC().Format(time.RFC3339)}
}

// CreateCheckpointInput is the input of create_checkpoint.
type CreateCheckpointInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name or id"`
	Comment string `json:"comment,omitempty" jsonschema:"one line saying what the checkpoint is"`
	Name    string `json:"name,omitempty" jsonschema:"a name to restore or fork it by; one is made up when empty"`
	Memory  *bool  `json:"memory,omitempty" jsonschema:"true (the default): memory and disk, so a restore resumes running processes; false: disk only"`
}

// CheckpointOutput is the output of create_checkpoint.
type CheckpointOutput struct {
	Checkpoint Checkpoint `json:"checkpoint"`
}

// ListCheckpointsOutput is the output of list_checkpoints.
type ListCheckpointsOutput struct {
	Checkpoints []Checkpoint `json:"checkpoints" jsonschema:"oldest first"`
}

// CheckpointRef names a checkpoint of a sandbox.
type CheckpointRef struct {
	Sandbox    string `json:"sandbox" jsonschema:"the sandbox's name or id"`
	Checkpoint string `json:"checkpoint" jsonschema:"the checkpoint's id (v1, auto-1, …) or name"`
}

// RestoreOutput is the output of restore_checkpoint.
type RestoreOutput struct {
	Sandbox Sandbox `json:"sandbox"`
	// Checkpoint is the automatic checkpoint the daemon kept of the
	// sandbox as it was before the restore.
	Checkpoint string `json:"checkpoint,omitempty" jsonschema:"the automatic checkpoint of the sandbox as it was before the restore: restore_checkpoint to it to undo the restore"`
}

// ForkInput is the input of fork_sandbox.
type ForkInput struct {
	CheckpointRef
	Name string `json:"name,omitempty" jsonschema:"the fork's name; the daemon picks one when empty"`
}

func (s *Server) addCheckpointTools() {
	addTool(s, tool{name: "create_checkpoint", title: "Checkpoint a sandbox", kind: manages,
		desc: "Checkpoint a sandbox, to restore it to later or fork it from. A memory checkpoint (the default) pauses the sandbox while it is taken."},
		func(ctx context.Context, c *call, in CreateCheckpointInput) (CheckpointOutput, error) {
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return CheckpointOutput{}, err
			}
			cp, err := s.c.CreateCheckpoint(ctx, in.Sandbox, api.CreateCheckpoint{Comment: in.Comment, Name: in.Name, Memory: in.Memory})
			if err != nil {
				return CheckpointOutput{}, err
			}
			c.checkpoint = cp.ID
			return CheckpointOutput{Checkpoint: checkpointOf(cp)}, nil
		})

	addTool(s, tool{name: "list_checkpoints", title: "List checkpoints", kind: reads,
		desc: "List a sandbox's checkpoints, oldest first."},
		func(ctx context.Context, c *call, in SandboxRef) (ListCheckpointsOutput, error) {
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return ListCheckpointsOutput{}, err
			}
			cps, err := s.c.ListCheckpoints(ctx, in.Sandbox)
			if err != nil {
				return ListCheckpointsOutput{}, err
			}
			out := ListCheckpointsOutput{Checkpoints: make([]Checkpoint, 0, len(cps))}
			for i := range cps {
				out.Checkpoints = append(out.Checkpoints, checkpointOf(&cps[i]))
			}
			return out, nil
		})

	addTool(s, tool{name: "restore_checkpoint", title: "Restore a checkpoint", kind: manages, destructive: true,
		desc: "Roll a sandbox back to one of its checkpoints, in place. The sandbox as it was is kept first as an automatic checkpoint, " +
			"whose id comes back as checkpoint, so the restore can be undone."},
		func(ctx context.Context, c *call, in CheckpointRef) (RestoreOutput, error) {
			if in.Checkpoint == "" {
				return RestoreOutput{}, invalid("checkpoint: give a checkpoint's id (v1, auto-1, …) or name, from list_checkpoints")
			}
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return RestoreOutput{}, err
			}
			c.detail = in.Checkpoint
			before, err := s.c.ListCheckpoints(ctx, in.Sandbox)
			if err != nil {
				return RestoreOutput{}, err
			}
			sb, err := s.c.RestoreCheckpoint(ctx, in.Sandbox, in.Checkpoint)
			if err != nil {
				return RestoreOutput{}, err
			}
			out := RestoreOutput{Sandbox: sandboxOf(sb)}
			// The automatic checkpoint is the one that was not there before.
			if after, err := s.c.ListCheckpoints(ctx, in.Sandbox); err == nil {
				out.Checkpoint = newAuto(before, after)
			} else {
				s.log.Warn("finding the checkpoint a restore kept", "sandbox", in.Sandbox, "error", err.Error())
			}
			c.checkpoint = out.Checkpoint
			return out, nil
		})

	addTool(s, tool{name: "fork_sandbox", title: "Fork a sandbox", kind: manages,
		desc: "Make a new, independent sandbox from a checkpoint of a sandbox; from a memory checkpoint its processes carry on where they were."},
		func(ctx context.Context, c *call, in ForkInput) (SandboxOutput, error) {
			if in.Checkpoint == "" {
				return SandboxOutput{}, invalid("checkpoint: give a checkpoint's id (v1, auto-1, …) or name, from list_checkpoints")
			}
			if err := s.allowNew(in.Name); err != nil {
				return SandboxOutput{}, err
			}
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return SandboxOutput{}, err
			}
			c.detail = in.Checkpoint + " -> " + in.Name
			sb, err := s.c.Fork(ctx, in.Sandbox, in.Checkpoint, in.Name)
			if err != nil {
				return SandboxOutput{}, err
			}
			c.detail = in.Checkpoint + " -> " + sb.Name
			return SandboxOutput{Sandbox: sandboxOf(sb)}, nil
		})
}

// newAuto is the id of the newest automatic checkpoint in after that is not
// in before; "" when there is none.
func newAuto(before, after []api.Checkpoint) string {
	had := make(map[string]bool, len(before))
	for _, cp := range before {
		had[cp.ID] = true
	}
	for i := len(after) - 1; i >= 0; i-- {
		if after[i].Auto && !had[after[i].ID] {
			return after[i].ID
		}
	}
	return ""
}
