// Command loam is loam's one binary: the CLI, the daemon (loam serve) and,
// inside each sandbox, the agent that is the sandbox's init (loam agent).
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"loam.dev/loam/internal/agent"
	"loam.dev/loam/internal/cli"
	"loam.dev/loam/internal/daemon"
)

func main() {
	root := cli.NewRoot(daemon.Command(), agentCommand())
	os.Exit(cli.Execute(context.Background(), root))
}

// agentCommand is `loam agent`, run by the runtime as each sandbox's init.
func agentCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "agent",
		Short:  "Run as a sandbox's init and agent (started by the daemon, inside the sandbox)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := agent.ConfigFromEnv()
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			return agent.Run(cmd.Context(), cfg)
		},
	}
}
