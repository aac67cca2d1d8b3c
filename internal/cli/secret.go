package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// secretCommands set, list and delete the secrets the daemon hands to
// sandboxes.
type secretCommands struct{ *app }

func (sc *secretCommands) secretCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Store secrets that sandboxes get as env or files",
		Long: `Secrets are stored by the daemon, encrypted at rest, and given to sandboxes
that name them at create (loam create --secret ENV=NAME, --secret-file
PATH=NAME). No command or API call shows a secret's value.`,
	}
	cmd.AddCommand(sc.secretSetCmd(), sc.secretLsCmd(), sc.secretRmCmd())
	return cmd
}

func (sc *secretCommands) secretSetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "set NAME",
		Short: "Store a secret, its value read from stdin or a prompt",
		Long: `Store a secret. The value is read from stdin, or asked for without echo
on a terminal; never from the command line, where other users and the shell's
history would see it. One trailing newline is dropped, so that
'echo value | loam secret set NAME' stores "value". Setting a secret
again replaces its value; sandboxes that have it get the new one at their next
boot, restore or fork.`,
		Example: `  loam secret set db-password
  loam secret set api-key < key.txt`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			value, err := sc.readSecretValue(args[0])
			if err != nil {
				return err
			}
			c, err := sc.connect()
			if err != nil {
				return err
			}
			_, err = c.PutSecret(cmd.Context(), args[0], value)
			return err
		},
	}
}

// readSecretValue reads a value from a prompt without echo when stdin is a
// terminal, else all of stdin, less one trailing newline.
func (sc *secretCommands) readSecretValue(name string) (string, error) {
	if f, ok := sc.stdin.(*os.File); ok && sc.interactive() {
		fmt.Fprintf(sc.stderr, "Value of %s: ", name)
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(sc.stderr)
		if err != nil {
			return "", fmt.Errorf("reading the value: %w", err)
		}
		return string(b), nil
	}
	b, err := io.ReadAll(io.LimitReader(sc.stdin, api.MaxSecretSize+2))
	if err != nil {
		return "", fmt.Errorf("reading the value from stdin: %w", err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) > api.MaxSecretSize {
		return "", fmt.Errorf("reading the value from stdin: more than %d bytes", api.MaxSecretSize)
	}
	if len(b) == 0 {
		return "", errors.New("reading the value from stdin: it is empty")
	}
	return string(b), nil
}

func (sc *secretCommands) secretLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List secrets (names and times, never values)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return list(cmd.Context(), sc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Secret, error) {
				return c.ListSecrets(ctx)
			}, listing[api.Secret]{
				header: []string{"NAME", "CREATED", "UPDATED"},
				row: func(s *api.Secret) []string {
					return []string{s.Name, formatTime(s.CreatedAt), formatTime(s.UpdatedAt)}
				},
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the secrets as a JSON array")
	return cmd
}

func (sc *secretCommands) secretRmCmd() *cobra.Command {
	var yes, force bool
	cmd := &cobra.Command{
		Use:   "rm NAME",
		Short: "Delete a secret",
		Long: `Delete a secret. A secret that sandboxes have is refused unless --force:
then they keep running with the value they have, and go without it from their
next boot, restore or fork.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sc.confirm(yes, "delete secret "+args[0]); err != nil {
				return err
			}
			c, err := sc.connect()
			if err != nil {
				return err
			}
			return c.DeleteSecret(cmd.Context(), args[0], force)
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "delete without asking")
	cmd.Flags().BoolVar(&force, "force", false, "delete it even if sandboxes have it")
	return cmd
}
