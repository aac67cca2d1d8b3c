package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// poolFlags are the flags of the two pool commands.
type poolFlags struct {
	asJSON bool
}

// poolCmd makes `loam checkpoint pool` and `loam template pool`: nargs
// arguments name the source, one more (optional) is the size to set.
func (a *app) poolCmd(use, short, long, example string, nargs int,
	get func(ctx context.Context, c *client.Client, args []string) (*api.Pool, error),
	set func(ctx context.Context, c *client.Client, args []string, size int) (*api.Pool, error)) *cobra.Command {
	var f poolFlags
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Long:    long,
		Example: example,
		Args:    cobra.RangeArgs(nargs, nargs+1),
		RunE: func(cmd *cobra.Command, args []string) error {
			size := -1
			if len(args) > nargs {
				n, err := strconv.Atoi(args[nargs])
				if err != nil || n < 0 {
					return fmt.Errorf("SIZE: want a number of sandboxes, 0 to %d, not %q", api.MaxPoolSize, args[nargs])
				}
				size = n
			}
			c, err := a.connect()
			if err != nil {
				return err
			}
			var p *api.Pool
			if size >= 0 {
				p, err = set(cmd.Context(), c, args[:nargs], size)
			} else {
				p, err = get(cmd.Context(), c, args)
			}
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(a.stdout, p)
			}
			return printPool(a.stdout, p)
		},
	}
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print the pool as JSON")
	return cmd
}

// printPool shows a pool in one line, and why it is held if it is.
func printPool(w io.Writer, p *api.Pool) error {
	if p.Size == 0 {
		_, err := fmt.Fprintln(w, "no pool")
		return err
	}
	_, err := fmt.Fprintf(w, "%d of %d ready, %d starting, %s of memory, %d claimed\n",
		p.Ready, p.Size, p.Starting, formatBytes(p.MemoryBytes), p.Claimed)
	if err == nil && p.Held != "" {
		_, err = fmt.Fprintf(w, "held: %s\n", p.Held)
	}
	return err
}

func (ck *checkpointCommands) checkpointPoolCmd() *cobra.Command {
	return ck.poolCmd("pool SANDBOX CHECKPOINT [SIZE]",
		"Keep a warm pool of forks of a checkpoint, or show it",
		`Keep SIZE forks of the checkpoint restored ahead of time, so that a fork of it
(loam fork) takes one and answers at once instead of waiting for a restore;
the pool refills in the background. Without SIZE, show the pool. 0 drains it.
Members are not listed as sandboxes; they fill only while the host has memory
to spare. Deleting the checkpoint drains its pool.`,
		"  loam checkpoint pool scratch v1 4\n  loam fork scratch v1 worker-1\n  loam checkpoint pool scratch v1",
		2,
		func(ctx context.Context, c *client.Client, args []string) (*api.Pool, error) {
			return c.CheckpointPool(ctx, args[0], args[1])
		},
		func(ctx context.Context, c *client.Client, args []string, size int) (*api.Pool, error) {
			return c.SetCheckpointPool(ctx, args[0], args[1], size)
		})
}

func (tc *templateCommands) templatePoolCmd() *cobra.Command {
	return tc.poolCmd("pool TEMPLATE [SIZE]",
		"Keep a warm pool of sandboxes of a template, or show it",
		`Keep SIZE sandboxes of the template made ahead of time (a built-in template's
with the daemon's default resources), so that a create of it that asks for no
other CPUs or memory takes one and answers at once; the pool refills in the
background. Without SIZE, show the pool. 0 drains it.`,
		"  loam template pool base 8\n  loam create web-1\n  loam template pool base",
		1,
		func(ctx context.Context, c *client.Client, args []string) (*api.Pool, error) {
			return c.TemplatePool(ctx, args[0])
		},
		func(ctx context.Context, c *client.Client, args []string, size int) (*api.Pool, error) {
			return c.SetTemplatePool(ctx, args[0], size)
		})
}
