package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

// nodeCommands let the operator see and manage the nodes of a cluster
// (loam serve --node).
type nodeCommands struct{ *app }

func (nc *nodeCommands) nodesCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes; cordon, uncordon or remove one (the operator's)",
		Long: `The nodes of the cluster the daemon belongs to (loam serve --node NAME
--advertise URL --database postgres://…), with what each reported with its
last lease renewal: ready while it renews its lease, unreachable once it ran
out (its sandboxes then show state unknown). With the admin token of loam
serve.`,
		Example: `  loam nodes
  loam nodes cordon node-2
  loam nodes uncordon node-2
  loam nodes drain node-2
  loam nodes remove node-3 --force`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := nc.connect()
			if err != nil {
				return err
			}
			list, err := c.ListNodes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(nc.stdout, map[string]any{"nodes": list})
			}
			if len(list) == 0 {
				fmt.Fprintln(nc.stderr, "no nodes: this daemon runs alone (loam serve --node NAME makes it one of a cluster)")
				return nil
			}
			t := newTable(nc.stdout, "NAME", "ROLE", "STATE", "CORDONED", "SANDBOXES", "RUNNING", "CPUS", "MEMORY FREE", "DISK FREE", "ADDRESS", "RENEWED")
			for _, n := range list {
				// A front end (role api) keeps no sandbox's disk.
				disk := "-"
				if n.Role != "api" {
					disk = formatMiB(int(n.DiskFreeMiB)) + "/" + formatMiB(int(n.DiskMiB))
				}
				t.row(n.Name, n.Role, string(n.State), strconv.FormatBool(n.Cordoned), strconv.Itoa(n.Sandboxes), strconv.Itoa(n.Running),
					strconv.Itoa(n.CPUs), formatMiB(int(n.MemoryFreeMiB))+"/"+formatMiB(int(n.MemoryMiB)),
					disk, n.Address, time.Since(n.RenewedAt).Round(time.Second).String()+" ago")
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the nodes as JSON")
	cmd.AddCommand(nc.cordonCmd(true), nc.cordonCmd(false), nc.drainCmd(), nc.removeCmd())
	return cmd
}

func (nc *nodeCommands) cordonCmd(on bool) *cobra.Command {
	use, short := "uncordon NAME", "Place new sandboxes on a node again"
	if on {
		use, short = "cordon NAME", "Place no new sandbox on a node; its sandboxes run on"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := nc.connect()
			if err != nil {
				return err
			}
			n, err := c.CordonNode(cmd.Context(), args[0], on)
			if err != nil {
				return err
			}
			state := "uncordoned"
			if n.Cordoned {
				state = "cordoned"
			}
			fmt.Fprintf(nc.stdout, "%s %s\n", n.Name, state)
			return nil
		},
	}
}

func (nc *nodeCommands) drainCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "drain NAME",
		Short: "Cordon a node and move every sandbox off it, with its processes",
		Long: `Cordon a node and move each of its sandboxes to the node placement picks:
a memory checkpoint stored in the object store (loam serve --objects), then a
restore on the other node, with the same name, id and URL. Calls and URL
requests that arrive meanwhile wait, then reach it there; streams to it end
(1011), as for a checkpoint. Sleeping sandboxes just lose their tie to the
node: their sleep image is stored, and each wakes on the node of the first
call that needs it (TO "(any node)"). Prints where each went, or why it
stayed.`,
		Example: "  loam nodes drain node-2",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := nc.connect()
			if err != nil {
				return err
			}
			res, err := c.DrainNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(nc.stdout, res)
			}
			t := newTable(nc.stdout, "NAME", "ID", "TO", "TOOK")
			for _, m := range res.Moved {
				to := m.To
				if to == "" {
					to = "(any node)" // asleep, tied to none: it wakes where used
				}
				t.row(m.Name, m.ID, to, (time.Duration(m.MS) * time.Millisecond).String())
			}
			for _, f := range res.Failed {
				t.row(f.Name, f.ID, "-", "failed: "+f.Error.Message)
			}
			if err := t.flush(); err != nil {
				return err
			}
			fmt.Fprintf(nc.stderr, "node %s is cordoned; %d sandboxes moved off it\n", res.Node, len(res.Moved))
			if len(res.Failed) > 0 {
				return fmt.Errorf("%d of %d sandboxes were not moved", len(res.Failed), len(res.Failed)+len(res.Moved))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the outcome as JSON")
	return cmd
}

func (nc *nodeCommands) removeCmd() *cobra.Command {
	var force, yes bool
	cmd := &cobra.Command{
		Use:     "remove NAME",
		Aliases: []string{"rm"},
		Short:   "Declare a node gone for good (its sandboxes are lost)",
		Long: `Declare a node gone for good: it can never join again under its name, and
each of its sandboxes is in state error ("node removed"); delete them with
loam rm. Refused while the node still renews its lease (stop its daemon
first). Needs --force, and asks first on a terminal (elsewhere it needs
--yes too).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !force {
				return fmt.Errorf("removing node %s loses every sandbox on it: say so with --force", args[0])
			}
			if err := nc.confirm(yes, fmt.Sprintf("remove node %s for good, with every sandbox on it", args[0])); err != nil {
				return err
			}
			c, err := nc.connect()
			if err != nil {
				return err
			}
			n, err := c.RemoveNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(nc.stdout, "removed node %s; %d of its sandboxes are in state error\n", args[0], n)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "say that the node's sandboxes are lost")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

func (nc *nodeCommands) moveCmd() *cobra.Command {
	var to string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "move NAME",
		Short: "Move a sandbox to another node of the cluster, with its processes (the operator's)",
		Long: `Move a sandbox to another node: a memory checkpoint (an automatic one,
"before moving to node …") stored in the object store (loam serve --objects),
its copy here removed, and a restore on node --to (or the node placement
picks), with the same name, id and URL. Calls and URL requests that arrive
meanwhile wait, then reach it there; streams to it end (1011). If the other
node cannot take it, it runs on here again.`,
		Example: "  loam move web --to node-3",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := nc.connect()
			if err != nil {
				return err
			}
			sb, err := c.MoveSandbox(cmd.Context(), args[0], to)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(nc.stdout, sb)
			}
			return writeSandbox(nc.stdout, sb)
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the node to move it to (default: the one placement picks)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}
