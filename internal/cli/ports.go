package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

func (gc *guestCommands) portsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ports [SANDBOX]",
		Short: "List the TCP ports programs in a sandbox listen on",
		Long: `List the TCP ports that programs in SANDBOX (inside a sandbox, that sandbox)
listen on, with the addresses they listen on. A port that listens only on
loopback is reachable through 'loam port-forward' but from nowhere else.`,
		Example: `  loam ports scratch
  loam ports watch scratch`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, _, err := gc.sandboxArgs(args)
			if err != nil {
				return err
			}
			return list(cmd.Context(), gc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Port, error) {
				return c.ListPorts(ctx, sb)
			}, listing[api.Port]{
				header: []string{"PORT", "ADDRESSES", "LOOPBACK"},
				row: func(p *api.Port) []string {
					return []string{strconv.Itoa(p.Port), strings.Join(p.Addresses, ","), yesNo(p.Loopback)}
				},
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the ports as a JSON array")
	cmd.AddCommand(gc.portsWatchCmd())
	return cmd
}

func (gc *guestCommands) portsWatchCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "watch [SANDBOX]",
		Short: "Print ports as they open and close",
		Long: `Print "open PORT" for every port listening now, then "open PORT" or
"close PORT" as programs in SANDBOX start or stop listening, until
interrupted. A memory checkpoint or a restore of the sandbox ends the
watch (exit status 1).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, _, err := gc.sandboxArgs(args)
			if err != nil {
				return err
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			for ev, err := range c.WatchPorts(cmd.Context(), sb) {
				if err != nil {
					return watchEnded(err)
				}
				if asJSON {
					b, _ := json.Marshal(ev)
					_, err = fmt.Fprintf(gc.stdout, "%s\n", b)
				} else {
					_, err = fmt.Fprintf(gc.stdout, "%s %d\n", ev.Type, ev.Port)
				}
				if err != nil {
					return err
				}
			}
			return cmd.Context().Err()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as a JSON object on a line of its own")
	return cmd
}

// watchEnded says why a watch ended in the words of a watch: the daemon's
// reason when it ended the stream, not an exec's.
func watchEnded(err error) error {
	var ae *api.Error
	if errors.Is(err, client.ErrStreamEnded) && errors.As(err, &ae) {
		return fmt.Errorf("the port watch ended: %s", ae.Message)
	}
	return err
}
