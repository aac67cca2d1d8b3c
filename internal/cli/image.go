package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// imageCommands pull, list and delete the OCI images templates are built
// from, and keep the credentials of the registries they come from.
type imageCommands struct{ *app }

func (ic *imageCommands) imageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Pull OCI images that sandboxes are made from",
		Long: `Images are OCI images (Docker images) that sandboxes can be made from
instead of a template: loam create --image REF. The daemon pulls each one,
unpacks it once per digest into a read-only template, and sandboxes of it
share that copy-on-write. A create with an image not pulled yet pulls it
first; loam image pull does it ahead of time, with a progress bar.

REF is a registry reference (python:3.12-slim, ghcr.io/o/app:1,
localhost:5000/app@sha256:…) or an absolute path on the daemon's host to an
OCI layout directory or a 'docker save' tarball.`,
	}
	cmd.AddCommand(ic.imagePullCmd(), ic.imageLsCmd(), ic.imageRmCmd(), ic.imageLoginCmd(), ic.imageLogoutCmd())
	return cmd
}

func (ic *imageCommands) imagePullCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image, showing its progress",
		Long: `Pull an image and wait until it is ready. On a terminal a progress bar
shows the bytes of its layers read; otherwise the command is quiet and prints
the image's id when it is done.`,
		Example: `  loam image pull python:3.12-slim
  loam image pull localhost:5000/app:dev
  loam image pull /srv/images/app.tar`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := ic.connect()
			if err != nil {
				return err
			}
			im, err := c.PullImage(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			im, err = ic.waitPull(cmd.Context(), c, im)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(ic.stdout, im)
			}
			fmt.Fprintln(ic.stdout, im.ID)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the image as JSON")
	return cmd
}

// waitPull waits for a pull to end, with a progress bar on stderr when
// stdout is a terminal (stdout stays for the answer).
func (ic *imageCommands) waitPull(ctx context.Context, c *client.Client, im *api.Image) (*api.Image, error) {
	var bar *progressbar.ProgressBar
	if ic.stdoutTerminal() {
		bar = progressbar.NewOptions64(-1,
			progressbar.OptionSetWriter(ic.stderr),
			progressbar.OptionSetDescription("pulling "+im.Ref),
			progressbar.OptionShowBytes(true),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionThrottle(100*time.Millisecond),
		)
		defer bar.Close()
	}
	im, err := c.WaitImage(ctx, im.ID, 200*time.Millisecond, func(im *api.Image) {
		if bar == nil {
			return
		}
		if im.Size > 0 && bar.GetMax64() != im.Size {
			bar.ChangeMax64(im.Size)
		}
		_ = bar.Set64(im.Pulled)
	})
	if bar != nil {
		_ = bar.Finish()
	}
	if errors.Is(err, client.ErrImagePull) {
		return nil, fmt.Errorf("pulling %s: %s", im.Ref, im.Error)
	}
	return im, err
}

// stdoutTerminal tells whether stdout is a terminal, for decorations.
func (ic *imageCommands) stdoutTerminal() bool {
	f, ok := ic.stdout.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (ic *imageCommands) imageLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return list(cmd.Context(), ic.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Image, error) {
				return c.ListImages(ctx)
			}, listing[api.Image]{
				header: []string{"ID", "REF", "STATE", "SIZE", "DIGEST", "CREATED"},
				row: func(im *api.Image) []string {
					state := string(im.State)
					if im.State == api.ImagePulling && im.Size > 0 {
						state = fmt.Sprintf("pulling %d%%", im.Pulled*100/im.Size)
					}
					return []string{im.ID, im.Ref, state, formatSize(im.Size), shortDigest(im.Digest), formatTime(im.CreatedAt)}
				},
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the images as a JSON array")
	return cmd
}

// formatSize is a byte count as people read it.
func formatSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		return d[:12]
	}
	if d == "" {
		return "-"
	}
	return d
}

func (ic *imageCommands) imageRmCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "rm ID",
		Short: "Delete an image",
		Long:  `Delete an image (by id, as loam image ls shows it). One that a sandbox uses is refused.`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ic.confirm(yes, "delete image "+args[0]); err != nil {
				return err
			}
			c, err := ic.connect()
			if err != nil {
				return err
			}
			return c.DeleteImage(cmd.Context(), args[0])
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "delete without asking")
	return cmd
}

func (ic *imageCommands) imageLoginCmd() *cobra.Command {
	var user string
	var passwordStdin bool
	cmd := &cobra.Command{
		Use:   "login REGISTRY",
		Short: "Store credentials for a private registry",
		Long: `Store the credentials the daemon pulls images from REGISTRY (a host:
ghcr.io, localhost:5000) with, encrypted like secrets. The password is read
with --password-stdin, or asked for without echo on a terminal; never from the
command line. Registries without stored credentials use the daemon's Docker
config file (~/.docker/config.json of the user running loam serve).`,
		Example: `  loam image login ghcr.io -u alice
  echo "$TOKEN" | loam image login ghcr.io -u alice --password-stdin`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if user == "" {
				return errors.New("give the user name with -u")
			}
			var password string
			if f, ok := ic.stdin.(*os.File); ok && !passwordStdin && ic.interactive() {
				fmt.Fprintf(ic.stderr, "Password for %s at %s: ", user, args[0])
				b, err := term.ReadPassword(int(f.Fd()))
				fmt.Fprintln(ic.stderr)
				if err != nil {
					return fmt.Errorf("reading the password: %w", err)
				}
				password = string(b)
			} else if passwordStdin {
				b, err := io.ReadAll(io.LimitReader(ic.stdin, 64<<10))
				if err != nil {
					return fmt.Errorf("reading the password from stdin: %w", err)
				}
				password = strings.TrimRight(string(b), "\r\n")
			} else {
				return errors.New("no terminal to ask for the password: give --password-stdin")
			}
			c, err := ic.connect()
			if err != nil {
				return err
			}
			_, err = c.LoginRegistry(cmd.Context(), args[0], user, password)
			return err
		},
	}
	cmd.Flags().StringVarP(&user, "username", "u", "", "the user name")
	cmd.Flags().BoolVar(&passwordStdin, "password-stdin", false, "read the password from stdin")
	return cmd
}

func (ic *imageCommands) imageLogoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "logout REGISTRY",
		Short: "Forget a registry's credentials",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := ic.connect()
			if err != nil {
				return err
			}
			return c.LogoutRegistry(cmd.Context(), args[0])
		},
	}
}
