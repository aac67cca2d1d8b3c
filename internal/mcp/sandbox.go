package mcp

import (
	"context"
	"time"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Sandbox is a sandbox as the tools show it: what an agent needs to pick
// one and reach it.
type Sandbox struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	State    string            `json:"state" jsonschema:"creating, running, sleeping, stopped, error, deleting or restoring; a sleeping sandbox wakes by itself when a tool uses it"`
	Reason   string            `json:"reason,omitempty" jsonschema:"why a sandbox is in state error"`
	Template string            `json:"template,omitempty"`
	Image    string            `json:"image,omitempty"`
	URL      string            `json:"url,omitempty" jsonschema:"where the daemon serves the sandbox's http_port"`
	HTTPPort int               `json:"http_port,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	// Fork names the checkpoint a fork was made from, as sandbox/checkpoint.
	Fork      string `json:"forked_from,omitempty" jsonschema:"the checkpoint a fork was made from, as sandbox/checkpoint"`
	CreatedAt string `json:"created_at"`
}

func sandboxOf(sb *api.Sandbox) Sandbox {
	out := Sandbox{
		ID: sb.ID, Name: sb.Name, State: string(sb.State), Reason: sb.Reason,
		Template: sb.Template, Image: sb.Image, URL: sb.URL, HTTPPort: sb.HTTPPort,
		CreatedAt: sb.CreatedAt.UTC().Format(time.RFC3339),
	}
	if len(sb.Labels) > 0 {
		out.Labels = sb.Labels
	}
	if sb.From != nil {
		out.Fork = sb.From.Sandbox + "/" + sb.From.Checkpoint
	}
	return out
}

// SandboxRef is the input of the tools that take only a sandbox.
type SandboxRef struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name or id"`
}

// CreateSandboxInput is the input of create_sandbox.
type CreateSandboxInput struct {
	Name      string            `json:"name,omitempty" jsonschema:"the new sandbox's name; the daemon picks one when empty"`
	Template  string            `json:"template,omitempty" jsonschema:"the template to make it from; the daemon's default when empty"`
	Image     string            `json:"image,omitempty" jsonschema:"an OCI image (such as python:3.12) to make it from, instead of a template"`
	CPUs      float64           `json:"cpus,omitempty" jsonschema:"CPU quota in cores"`
	MemoryMiB int               `json:"memory_mib,omitempty" jsonschema:"memory limit in MiB"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables of every process of the sandbox"`
	Labels    map[string]string `json:"labels,omitempty"`
	HTTPPort  int               `json:"http_port,omitempty" jsonschema:"the port inside the sandbox that its URL forwards to"`
}

// SandboxOutput is the output of create_sandbox and fork_sandbox.
type SandboxOutput struct {
	Sandbox Sandbox `json:"sandbox"`
}

// ListSandboxesInput is the input of list_sandboxes.
type ListSandboxesInput struct {
	Labels map[string]string `json:"labels,omitempty" jsonschema:"keep only sandboxes with all these labels"`
}

// ListSandboxesOutput is the output of list_sandboxes.
type ListSandboxesOutput struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// DeleteSandboxOutput is the output of delete_sandbox.
type DeleteSandboxOutput struct {
	Deleted string `json:"deleted"`
}

// URLOutput is the output of sandbox_url.
type URLOutput struct {
	URL    string `json:"url"`
	Public bool   `json:"public" jsonschema:"true when the URL is open to anyone who reaches the daemon"`
	// AccessToken opens a private sandbox's URL.
	AccessToken string `json:"access_token" jsonschema:"opens the URL when it is not public: send it as the header X-Loam-Access-Token"`
	OpenURL     string `json:"open_url" jsonschema:"the URL with the access token in its query, for a browser's first visit"`
}

func (s *Server) addSandboxTools() {
	addTool(s, tool{name: "create_sandbox", title: "Create a sandbox", kind: manages,
		desc: "Create a sandbox (an isolated Linux machine) from a template or an OCI image, and return it once it runs."},
		func(ctx context.Context, c *call, in CreateSandboxInput) (SandboxOutput, error) {
			c.detail = in.Name
			if err := s.allowNew(in.Name); err != nil {
				return SandboxOutput{}, err
			}
			if in.CPUs < 0 || in.MemoryMiB < 0 || in.HTTPPort < 0 || in.HTTPPort > 65535 {
				return SandboxOutput{}, invalid("cpus, memory_mib and http_port must be positive (http_port at most 65535)")
			}
			req := api.CreateSandbox{Name: in.Name, Template: in.Template, Image: in.Image,
				Env: in.Env, Labels: in.Labels, HTTPPort: in.HTTPPort}
			if in.CPUs > 0 || in.MemoryMiB > 0 {
				req.Resources = &api.Resources{CPUs: in.CPUs, MemoryMiB: in.MemoryMiB}
			}
			sb, err := s.c.CreateSandbox(ctx, req)
			if err != nil {
				return SandboxOutput{}, err
			}
			c.sandbox = sb.Name
			return SandboxOutput{Sandbox: sandboxOf(sb)}, nil
		})

	addTool(s, tool{name: "list_sandboxes", title: "List sandboxes", kind: reads,
		desc: "List the sandboxes this server may use, with their state and URL."},
		func(ctx context.Context, c *call, in ListSandboxesInput) (ListSandboxesOutput, error) {
			sbs, err := s.c.ListSandboxes(ctx, client.ListOptions{Labels: in.Labels})
			if err != nil {
				return ListSandboxesOutput{}, err
			}
			out := ListSandboxesOutput{Sandboxes: []Sandbox{}}
			for i := range sbs {
				if s.allowed(sbs[i].Name, sbs[i].ID) {
					out.Sandboxes = append(out.Sandboxes, sandboxOf(&sbs[i]))
				}
			}
			return out, nil
		})

	addTool(s, tool{name: "delete_sandbox", title: "Delete a sandbox", kind: manages, destructive: true,
		desc: "Delete a sandbox with its files, processes and checkpoints. This cannot be undone."},
		func(ctx context.Context, c *call, in SandboxRef) (DeleteSandboxOutput, error) {
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return DeleteSandboxOutput{}, err
			}
			if err := s.c.DeleteSandbox(ctx, in.Sandbox); err != nil {
				return DeleteSandboxOutput{}, err
			}
			return DeleteSandboxOutput{Deleted: in.Sandbox}, nil
		})

	addTool(s, tool{name: "sandbox_url", title: "Sandbox URL", kind: reads,
		desc: "The URL where the daemon serves the sandbox's http_port, and the access token that opens it when it is not public."},
		func(ctx context.Context, c *call, in SandboxRef) (URLOutput, error) {
			if err := s.use(ctx, c, in.Sandbox); err != nil {
				return URLOutput{}, err
			}
			sb, err := s.c.GetSandbox(ctx, in.Sandbox)
			if err != nil {
				return URLOutput{}, err
			}
			at, err := s.c.AccessToken(ctx, in.Sandbox)
			if err != nil {
				return URLOutput{}, err
			}
			return URLOutput{URL: at.URL, Public: sb.Public, AccessToken: at.AccessToken, OpenURL: client.OpenURL(at.URL, at.AccessToken)}, nil
		})
}
