package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"loam.dev/loam/api"
)

// networkFlags are the flags that make a network policy, on create, fork
// and network set.
type networkFlags struct {
	egress      string
	allow, deny []string
}

func (n *networkFlags) add(f *pflag.FlagSet) {
	f.StringVar(&n.egress, "egress", "", "network egress: all (the default) or none")
	f.StringArrayVar(&n.allow, "allow", nil, "let the sandbox reach `DEST`: an IPv4 address, prefix, host name or *.domain (repeatable; wins over --deny)")
	f.StringArrayVar(&n.deny, "deny", nil, "keep the sandbox from `DEST` (repeatable)")
}

// policy is the policy the flags give, or nil when none of them is set.
func (n *networkFlags) policy(f *pflag.FlagSet) *api.NetworkPolicy {
	if !f.Changed("egress") && !f.Changed("allow") && !f.Changed("deny") {
		return nil
	}
	return &api.NetworkPolicy{Egress: n.egress, Allow: n.allow, Deny: n.deny}
}

func (lc *sandboxCommands) networkCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Show or change a sandbox's network policy",
	}
	cmd.AddCommand(lc.networkSetCmd(), lc.networkGetCmd())
	return cmd
}

func (lc *sandboxCommands) networkSetCmd() *cobra.Command {
	var (
		n      networkFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "set SANDBOX",
		Short: "Replace a sandbox's network policy",
		Long: `Replace a sandbox's network policy. The new policy applies at once:
connections it forbids are cut. Flags left out are empty: --egress all by
default, no allow or deny entries.`,
		Example: `  loam network set scratch --egress none --allow pypi.org --allow '*.pythonhosted.org'
  loam network set scratch --egress all --deny 192.0.2.0/24`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := lc.connect()
			if err != nil {
				return err
			}
			p := api.NetworkPolicy{Egress: n.egress, Allow: n.allow, Deny: n.deny}
			sb, err := c.SetNetwork(cmd.Context(), args[0], p)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(lc.stdout, sb.Network)
			}
			return writeNetwork(lc.stdout, sb.Network)
		},
	}
	n.add(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the policy as JSON")
	return cmd
}

func (lc *sandboxCommands) networkGetCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get SANDBOX",
		Short: "Show a sandbox's network policy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := lc.connect()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(lc.stdout, sb.Network)
			}
			return writeNetwork(lc.stdout, sb.Network)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the policy as JSON")
	return cmd
}

func writeNetwork(w io.Writer, p api.NetworkPolicy) error {
	b := &block{w: w}
	b.line("egress", p.Egress)
	b.line("allow", strings.Join(p.Allow, ","))
	b.line("deny", strings.Join(p.Deny, ","))
	return b.err
}

// formatNetwork is a policy on one line: "none; allow a,b; deny c".
func formatNetwork(p api.NetworkPolicy) string {
	s := p.Egress
	if len(p.Allow) > 0 {
		s += fmt.Sprintf("; allow %s", strings.Join(p.Allow, ","))
	}
	if len(p.Deny) > 0 {
		s += fmt.Sprintf("; deny %s", strings.Join(p.Deny, ","))
	}
	return s
}
