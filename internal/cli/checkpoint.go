package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// checkpointCommands take, list, restore and delete a sandbox's
// checkpoints, fork a sandbox from one, and size a checkpoint's warm pool.
type checkpointCommands struct{ *app }

// envSandbox names the sandbox a command runs in; the daemon sets it inside
// every sandbox, so `loam checkpoint create` there needs no name.
const envSandbox = "LOAM_SANDBOX"

// self is the sandbox the CLI runs in, or "" outside one. The sandbox's
// agent keeps its id in the data dir (rewritten after a fork, whose
// processes still have their source's LOAM_SANDBOX), so that file comes first.
func (a *app) self() string {
	dir := a.getenv(client.EnvDataDir)
	if dir == "" {
		dir = client.DefaultDataDir
	}
	if b, err := os.ReadFile(filepath.Join(dir, "sandbox")); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id
		}
	}
	return a.getenv(envSandbox)
}

// sandboxArgs splits args into the sandbox and the rest, named by rest
// (such as "CHECKPOINT"): with one more arg than rest names, the first is
// the sandbox; with as many, inside a sandbox, it is that sandbox.
func (a *app) sandboxArgs(args []string, rest ...string) (string, []string, error) {
	n := len(rest)
	if len(args) == n+1 {
		return args[0], args[1:], nil
	}
	if s := a.self(); s != "" {
		return s, args, nil
	}
	if n == 0 || len(args) == 0 {
		return "", nil, errors.New("no sandbox given")
	}
	// One argument short: the sandbox, likely, was given, and the last
	// of the rest was not.
	return "", nil, fmt.Errorf("no %s given: give SANDBOX %s (SANDBOX may be left out only inside a sandbox)",
		strings.ToLower(rest[n-1]), strings.Join(rest, " "))
}

func (ck *checkpointCommands) checkpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Take, list, restore and delete checkpoints",
		Long: `A checkpoint is a snapshot of a sandbox you can go back to (restore) or
start new sandboxes from (fork). A memory checkpoint (the default) holds the
sandbox's memory and disk, so processes come back running where they were; a
disk-only one holds the disk, and comes back as a fresh boot on it.`,
	}
	cmd.AddCommand(
		ck.checkpointCreateCmd(),
		ck.checkpointLsCmd(),
		ck.checkpointGetCmd(),
		ck.checkpointRmCmd(),
		ck.checkpointRestoreCmd(),
		ck.checkpointPoolCmd(),
	)
	return cmd
}

func (ck *checkpointCommands) checkpointCreateCmd() *cobra.Command {
	var (
		req                          api.CreateCheckpoint
		diskOnly, waitStored, asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "create [SANDBOX]",
		Short: "Take a checkpoint and print its id",
		Long: `Take a checkpoint of SANDBOX (inside a sandbox, of that sandbox) and print
its id. A memory checkpoint pauses the sandbox for about a second and ends
every exec stream on it; a disk-only one (--disk-only) does neither.`,
		Example: `  loam checkpoint create scratch --comment 'site up, state v1'`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, _, err := ck.sandboxArgs(args)
			if err != nil {
				return err
			}
			if diskOnly {
				memory := false
				req.Memory = &memory
			}
			if waitStored {
				req.Wait = api.WaitStored
			}
			c, err := ck.connect()
			if err != nil {
				return err
			}
			cp, err := c.CreateCheckpoint(cmd.Context(), sandbox, req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ck.stdout, cp)
			}
			_, err = fmt.Fprintln(ck.stdout, cp.ID)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Comment, "comment", "", "what the checkpoint holds, shown by ls")
	f.StringVar(&req.Name, "name", "", "a name the checkpoint can be found by besides its id")
	f.BoolVar(&diskOnly, "disk-only", false, "checkpoint the disk only: no pause; a restore boots fresh")
	f.BoolVar(&waitStored, "wait-stored", false, "return once the checkpoint is in the daemon's object store too (loam serve --objects), not as soon as it is taken")
	f.BoolVar(&asJSON, "json", false, "print the checkpoint as JSON")
	return cmd
}

func (ck *checkpointCommands) checkpointLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls [SANDBOX]",
		Aliases: []string{"list"},
		Short:   "List a sandbox's checkpoints, oldest first",
		Args:    cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, _, err := ck.sandboxArgs(args)
			if err != nil {
				return err
			}
			return list(cmd.Context(), ck.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Checkpoint, error) {
				return c.ListCheckpoints(ctx, sandbox)
			}, checkpointListing)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checkpoints as a JSON array")
	return cmd
}

var checkpointListing = listing[api.Checkpoint]{
	header: []string{"ID", "KIND", "AUTO", "CREATED", "COMMENT"},
	row: func(cp *api.Checkpoint) []string {
		return []string{cp.ID, checkpointKind(cp), yesNo(cp.Auto), formatTime(cp.CreatedAt), cp.Comment}
	},
}

func (ck *checkpointCommands) checkpointGetCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get [SANDBOX] CHECKPOINT",
		Short: "Show a checkpoint",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, rest, err := ck.sandboxArgs(args, "CHECKPOINT")
			if err != nil {
				return err
			}
			c, err := ck.connect()
			if err != nil {
				return err
			}
			cp, err := c.GetCheckpoint(cmd.Context(), sandbox, rest[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ck.stdout, cp)
			}
			return writeCheckpoint(ck.stdout, cp)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checkpoint as JSON")
	return cmd
}

func (ck *checkpointCommands) checkpointRmCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:     "rm [SANDBOX] CHECKPOINT",
		Aliases: []string{"delete"},
		Short:   "Delete a checkpoint",
		Long: `Delete a checkpoint. Forks made from it carry on. On a terminal rm asks
first; elsewhere it needs --yes.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, rest, err := ck.sandboxArgs(args, "CHECKPOINT")
			if err != nil {
				return err
			}
			ref := rest[0]
			if err := ck.confirm(yes, fmt.Sprintf("delete checkpoint %s of %s", ref, sandbox)); err != nil {
				return err
			}
			c, err := ck.connect()
			if err != nil {
				return err
			}
			return c.DeleteCheckpoint(cmd.Context(), sandbox, ref)
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "delete without asking")
	return cmd
}

func (ck *checkpointCommands) checkpointRestoreCmd() *cobra.Command {
	var yes, asJSON bool
	cmd := &cobra.Command{
		Use:   "restore [SANDBOX] CHECKPOINT",
		Short: "Roll a sandbox back to a checkpoint",
		Long: `Roll SANDBOX back to CHECKPOINT and print its name and state. Its current
state is kept first as an automatic checkpoint (auto-N), so a restore can be
undone. Every exec session on the sandbox ends. On a terminal restore asks
first; elsewhere it needs --yes.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, rest, err := ck.sandboxArgs(args, "CHECKPOINT")
			if err != nil {
				return err
			}
			ref := rest[0]
			if err := ck.confirm(yes, fmt.Sprintf("restore %s to checkpoint %s", sandbox, ref)); err != nil {
				return err
			}
			c, err := ck.connect()
			if err != nil {
				return err
			}
			sb, err := c.RestoreCheckpoint(cmd.Context(), sandbox, ref)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ck.stdout, sb)
			}
			_, err = fmt.Fprintf(ck.stdout, "%s\t%s\n", sb.Name, sb.State)
			return err
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "restore without asking")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the restored sandbox as JSON")
	return cmd
}
