package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// sleepCmd is `loam sleep NAME...`: put sandboxes to sleep now.
func (lc *sandboxCommands) sleepCmd() *cobra.Command {
	return lc.sleepWakeCmd("sleep", "Put sandboxes to sleep now",
		`Put sandboxes to sleep now: their memory and disk are kept, and they use no
CPU or memory until woken (loam wake, or any call that needs them running).`,
		(*client.Client).Sleep)
}

// wakeCmd is `loam wake NAME...`: wake sleeping sandboxes.
func (lc *sandboxCommands) wakeCmd() *cobra.Command {
	return lc.sleepWakeCmd("wake", "Wake sleeping sandboxes, or boot broken ones again",
		`Wake sleeping sandboxes where they were: same processes, same sessions.
Any call that needs a sandbox running (run, exec, files, ports, its URL)
wakes it too. A sandbox in state error (say its sandbox process died; loam
get shows the reason) is booted again on its disk: its files are kept, its
processes start afresh. Only loam wake does that.`,
		(*client.Client).Wake)
}

func (lc *sandboxCommands) sleepWakeCmd(verb, short, long string, call func(*client.Client, context.Context, string) (*api.Sandbox, error)) *cobra.Command {
	return &cobra.Command{
		Use:   verb + " NAME...",
		Short: short,
		Long:  long,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := lc.connect()
			if err != nil {
				return err
			}
			failed := false
			for _, name := range args {
				sb, err := call(c, cmd.Context(), name)
				if err != nil {
					if len(args) == 1 {
						return err
					}
					fmt.Fprintf(lc.stderr, "loam: %s\n", message(err))
					failed = true
					continue
				}
				fmt.Fprintf(lc.stdout, "%s\t%s\n", sb.Name, sb.State)
			}
			if failed {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
}
