package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
)

func (ck *checkpointCommands) forkCmd() *cobra.Command {
	var (
		req            api.CreateSandbox
		env, labels    []string
		secrets, files []string
		asJSON         bool
		net            networkFlags
	)
	cmd := &cobra.Command{
		Use:   "fork SANDBOX CHECKPOINT [NEWNAME]",
		Short: "Make a new sandbox from a checkpoint",
		Long: `Make a new, independent sandbox from a checkpoint of SANDBOX: its disk, and
its memory when the checkpoint has memory, so a fork of a memory checkpoint
starts with the source's processes running. Its template, image and resources
come from the checkpoint; env, labels and the rest are the fork's own. Its
secrets are its source's unless it gives its own (--secret, --secret-file).
Without NEWNAME the daemon picks a name.

With --count N it makes N forks at once, named NEWNAME-1 … NEWNAME-N (or by
the daemon without NEWNAME), each made as a fork of its own would be (in a
cluster, placed on its own), and prints one line for each: its sandbox, or
why it was not made. It exits 1 when any was not.`,
		Example: `  loam fork scratch v1 scratch-copy --label owner=docs
  loam fork scratch v1 worker --count 3`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 3 {
				req.Name = args[2]
			}
			var err error
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if req.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if req.Secrets, err = parseKV("secret", secrets); err != nil {
				return err
			}
			if req.SecretFiles, err = parseKV("secret-file", files); err != nil {
				return err
			}
			c, err := ck.connect()
			if err != nil {
				return err
			}
			req.Network = net.policy(cmd.Flags())
			if cmd.Flags().Changed("count") {
				list, err := c.ForkMany(cmd.Context(), args[0], args[1], req)
				if err != nil {
					return err
				}
				return writeForks(ck.stdout, list, asJSON)
			}
			sb, err := c.ForkWith(cmd.Context(), args[0], args[1], req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ck.stdout, sb)
			}
			return writeSandbox(ck.stdout, sb)
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable `KEY=VALUE` (repeatable)")
	f.StringArrayVarP(&labels, "label", "l", nil, "label `KEY=VALUE` (repeatable)")
	f.StringArrayVar(&secrets, "secret", nil, "give secret NAME as environment variable ENV instead of the source's secrets: `ENV=NAME` (repeatable)")
	f.StringArrayVar(&files, "secret-file", nil, "give secret NAME as a file, mode 0400, instead of the source's secrets: `PATH=NAME` (repeatable)")
	f.StringVar(&req.Idle, "idle", "", "sleep after this long without activity, such as 10m")
	f.IntVar(&req.HTTPPort, "http-port", 0, "port the sandbox's URL forwards to, such as 8080")
	net.add(f)
	f.IntVar(&req.Count, "count", 0, fmt.Sprintf("make `N` forks at once (1 to %d), named NEWNAME-1 … NEWNAME-N", api.MaxForkCount))
	f.BoolVar(&asJSON, "json", false, "print the sandbox (the list of forks, with --count) as JSON")
	return cmd
}

// writeForks prints the forks of a count, one line each (its sandbox, or
// the error that kept it from being made), or as JSON; an error says how
// many were not made.
func writeForks(w io.Writer, list *api.ForkList, asJSON bool) error {
	failed := 0
	t := newTable(w, "NAME", "ID", "NODE", "STATE")
	for _, f := range list.Forks {
		if f.Sandbox == nil {
			failed++
			why := "failed"
			if f.Error != nil {
				why += ": " + message(f.Error)
			}
			t.row(orDash(f.Name), "-", "-", why)
			continue
		}
		t.row(f.Sandbox.Name, f.Sandbox.ID, orDash(f.Sandbox.Node), string(f.Sandbox.State))
	}
	var err error
	if asJSON {
		err = printJSON(w, list)
	} else {
		err = t.flush()
	}
	if err == nil && failed > 0 {
		err = fmt.Errorf("%d of %d forks were not made", failed, len(list.Forks))
	}
	return err
}
