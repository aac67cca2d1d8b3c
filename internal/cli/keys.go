package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// keyCommands make, list and revoke an org's API keys, and read its
// audit log.
type keyCommands struct{ *app }

func (kc *keyCommands) keysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Make, list and revoke API keys",
		Long: `API keys are what people, CI and agents call loam with (LOAM_TOKEN takes one).
Each has a scope: read (list and get), write (make, change and delete
sandboxes, run commands) or admin (keys and the audit log too). A key made
with labels sees only the sandboxes that have them, and gives them to every
sandbox it makes: the key to hand an agent. Needs an admin key or the admin
token of loam serve.`,
	}
	cmd.AddCommand(kc.keysCreateCmd(), kc.keysLsCmd(), kc.keysRmCmd())
	return cmd
}

func (kc *keyCommands) keysCreateCmd() *cobra.Command {
	var (
		scope, expires, org string
		labels              []string
		asJSON              bool
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Make an API key and print its secret, once",
		Example: `  loam keys create ci --scope write --expires 30d
  loam keys create agent-7 --label owner=agent-7
  loam keys create docs-admin --org docs --scope admin`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			c, err := kc.connect()
			if err != nil {
				return err
			}
			req := api.CreateKey{Name: args[0], Scope: api.Scope(scope), ExpiresIn: expires, Labels: sel}
			var k *api.Key
			if org != "" {
				k, err = c.CreateOrgKey(cmd.Context(), org, req)
			} else {
				k, err = c.CreateKey(cmd.Context(), req)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(kc.stdout, k)
			}
			fmt.Fprintf(kc.stdout, "id:      %s\nscope:   %s\n", k.ID, k.Scope)
			if len(k.Labels) > 0 {
				fmt.Fprintf(kc.stdout, "labels:  %s\n", formatKV(k.Labels))
			}
			if k.ExpiresAt != nil {
				fmt.Fprintf(kc.stdout, "expires: %s\n", formatTime(*k.ExpiresAt))
			}
			fmt.Fprintf(kc.stdout, "secret:  %s\n", k.Secret)
			fmt.Fprintln(kc.stderr, "The secret is shown only now: loam keeps its hash alone.")
			return nil
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "read, write or admin (write unless given)")
	cmd.Flags().StringVar(&org, "org", "", "make the key in `ORG` (the operator's: an org's first key)")
	cmd.Flags().StringVar(&expires, "expires", "", "how long the key lives: 720h or 30d (never unless given)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "limit the key to sandboxes labelled `KEY=VALUE` (repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the key, its secret included, as JSON")
	return cmd
}

func (kc *keyCommands) keysLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the org's API keys (never their secrets)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return list(cmd.Context(), kc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Key, error) {
				return c.ListKeys(ctx)
			}, listing[api.Key]{
				header: []string{"ID", "NAME", "SCOPE", "LABELS", "CREATED", "BY", "LAST USED", "EXPIRES"},
				row: func(k *api.Key) []string {
					return []string{k.ID, k.Name, string(k.Scope), orDash(formatKV(k.Labels)), formatTime(k.CreatedAt), k.CreatedBy,
						optionalTime(k.LastUsedAt), optionalTime(k.ExpiresAt)}
				},
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the keys as a JSON array")
	return cmd
}

func optionalTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return formatTime(*t)
}

func (kc *keyCommands) keysRmCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "rm ID...",
		Short: "Revoke API keys",
		Long: `Revoke keys: calls with them fail from now on, and the streams still open
with them (an exec, a port stream) end within seconds.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := kc.confirm(yes, "revoke key "+strings.Join(args, ", ")); err != nil {
				return err
			}
			c, err := kc.connect()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.RevokeKey(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "revoke without asking")
	return cmd
}

func (kc *keyCommands) auditCmd() *cobra.Command {
	var (
		since, action string
		asJSON        bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Read the audit log: who changed what, and how it ended",
		Long: `The calls that changed something, or tried to, oldest first: time, the key
that called (admin for the token of loam serve), the action, its target, its
outcome (ok or the error code) and the client's address.`,
		Example: `  loam audit --since 1h
  loam audit --action exec.start --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var o client.AuditOptions
			o.Action = action
			if since != "" {
				if d, err := time.ParseDuration(since); err == nil && d >= 0 {
					o.Since = time.Now().Add(-d)
				} else if t, err := time.Parse(time.RFC3339, since); err == nil {
					o.Since = t
				} else {
					return fmt.Errorf("--since %q: want how long ago (1h) or a time (2026-12-05T10:00:00Z)", since)
				}
			}
			return list(cmd.Context(), kc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.AuditEvent, error) {
				return c.Audit(ctx, o)
			}, listing[api.AuditEvent]{
				header: []string{"TIME", "KEY", "ACTION", "TARGET", "OUTCOME", "CLIENT"},
				row: func(e *api.AuditEvent) []string {
					return []string{formatTime(e.Time), e.Key, e.Action, e.Target, e.Outcome, e.Client}
				},
			})
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "events since how long ago (1h) or a time (RFC 3339)")
	cmd.Flags().StringVar(&action, "action", "", "events of this action only (sandbox.create, exec.start, key.revoke)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the events as a JSON array")
	return cmd
}
