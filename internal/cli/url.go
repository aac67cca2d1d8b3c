package cli

import (
	"github.com/spf13/cobra"

	"loam.dev/loam/client"
)

func (lc *sandboxCommands) urlCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "url NAME",
		Short: "Show a sandbox's URL and the token that opens it",
		Long: `Show the URL where the daemon serves a sandbox's http_port, whether it is
public, and the access token that opens it when it is not: send it in the
header X-Loam-Access-Token, or open the "open" link once in a browser, which
then keeps it in a cookie for that URL.`,
		Example: `  loam url web
  curl -H "X-Loam-Access-Token: $(loam url web --json | jq -r .access_token)" http://web--default.localhost:7070/`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := lc.connect()
			if err != nil {
				return err
			}
			sb, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			at, err := c.AccessToken(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(lc.stdout, at)
			}
			b := &block{w: lc.stdout}
			b.line("url", at.URL)
			b.line("access", access(sb.Public))
			b.line("token", at.AccessToken)
			if !sb.Public {
				b.line("open", client.OpenURL(at.URL, at.AccessToken))
			}
			return b.err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the URL and access token as JSON")
	return cmd
}
