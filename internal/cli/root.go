// Package cli is loam's command line: one file per command noun, each
// command built by its own constructor on top of the Go SDK (package client).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
	"loam.dev/loam/internal/version"
)

// ExitError makes Execute exit with Code. Err, when not nil, is printed
// first as any other error; a nil Err prints nothing, for a status that
// speaks for itself (the exit status of a command run in a sandbox).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// app is what every command works with: the streams, the way to reach the
// daemon and the terminal checks, all replaceable in tests. Its methods are
// the helpers commands share (the sandbox an argument names, confirmation
// prompts, progress) and the few commands of no capability (bench, mcp,
// version); each capability's commands are on a type of their own that
// embeds it (sandboxCommands, checkpointCommands, guestCommands,
// templateCommands, imageCommands, secretCommands), wired in newRoot.
type app struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// connect makes the API client; called only by commands that need one,
	// so `loam --help` works without a daemon.
	connect func() (*client.Client, error)
	// interactive reports whether someone can answer a prompt: stdin and
	// stderr (where prompts go, keeping stdout clean for pipes) are terminals.
	interactive func() bool
	// localTerminal lets `run` use the process's own terminal: raw mode,
	// window sizes and signal forwarding. Off in tests.
	localTerminal bool
}

// NewRoot returns the `loam` command with the CLI's commands, plus extra
// (the daemon's `serve`, the in-sandbox `agent`). Run it with Execute.
func NewRoot(extra ...*cobra.Command) *cobra.Command {
	a := &app{
		stdin:   os.Stdin,
		stdout:  os.Stdout,
		stderr:  os.Stderr,
		getenv:  os.Getenv,
		connect: func() (*client.Client, error) { return client.FromEnv() },
		interactive: func() bool {
			return term.IsTerminal(int(os.Stdin.Fd())) && term.IsTerminal(int(os.Stderr.Fd()))
		},
		localTerminal: true,
	}
	return newRoot(a, extra...)
}

func newRoot(a *app, extra ...*cobra.Command) *cobra.Command {
	root := &cobra.Command{
		Use:   "loam",
		Short: "Sandboxes you can checkpoint, restore and fork",
		Long: `loam runs sandboxes: isolated Linux machines you can run commands in,
checkpoint, roll back and fork.

The CLI talks to the daemon at $LOAM_API_URL with the token $LOAM_TOKEN;
without them, to the local daemon (its files in $LOAM_DATA_DIR, /var/lib/loam).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.Version = version.String()
	root.SetVersionTemplate("loam {{.Version}}\n")
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())
	})
	// Each capability's commands live on a type of their own; all share a.
	var (
		sandboxes   = &sandboxCommands{a}
		checkpoints = &checkpointCommands{a}
		guest       = &guestCommands{a}
		templates   = &templateCommands{a}
		images      = &imageCommands{a}
		secrets     = &secretCommands{a}
		orgs        = &orgCommands{a}
		keys        = &keyCommands{a}
		nodes       = &nodeCommands{a}
	)
	root.AddCommand(
		sandboxes.createCmd(),
		sandboxes.lsCmd(),
		sandboxes.getCmd(),
		sandboxes.rmCmd(),
		sandboxes.updateCmd(),
		sandboxes.runCmd(),
		templates.templatesCmd(),
		templates.templateCmd(),
		checkpoints.checkpointCmd(),
		checkpoints.forkCmd(),
		sandboxes.sleepCmd(),
		sandboxes.wakeCmd(),
		guest.filesCmd(),
		guest.cpCmd(),
		guest.watchCmd(),
		guest.execCmd(),
		guest.attachCmd(),
		guest.sessionsCmd(),
		guest.logsCmd(),
		guest.killCmd(),
		guest.serviceCmd(),
		guest.portsCmd(),
		guest.portForwardCmd(),
		secrets.secretCmd(),
		images.imageCmd(),
		sandboxes.urlCmd(),
		sandboxes.networkCmd(),
		orgs.orgCmd(),
		orgs.orgsCmd(),
		nodes.nodesCmd(),
		nodes.moveCmd(),
		keys.keysCmd(),
		keys.auditCmd(),
		a.benchCmd(),
		a.mcpCmd(),
		a.versionCmd(),
	)
	root.AddCommand(extra...)
	return root
}

// Execute runs root (from NewRoot) with ctx and returns the status the
// process should exit with: 0; the status of the command `loam run` ran (127
// when it was not found, 126 when it could not be started otherwise); or 1
// after printing "loam: <message>" on stderr. Don't cancel ctx on SIGINT or
// SIGTERM: `loam run` forwards them to the command it runs.
func Execute(ctx context.Context, root *cobra.Command) int {
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	code := 1
	var ee *ExitError
	if errors.As(err, &ee) {
		code = ee.Code
		err = ee.Err
	}
	if err != nil {
		fmt.Fprintf(root.ErrOrStderr(), "loam: %s\n", message(err))
	}
	return code
}

// message is what the user reads for err: the API's own message when the
// daemon refused (it names the sandbox or checkpoint already), else the whole
// chain of context.
func message(err error) string {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return err.Error()
	}
	msg := ae.Message
	if msg == "" {
		msg = string(ae.Code)
	}
	if ae.Code == api.CodeUnauthorized {
		// The daemon's words are for any HTTP client ("send
		// Authorization: Bearer"); a CLI user sets a variable.
		msg = fmt.Sprintf("missing or wrong token: set %s to an API key, or to the daemon's token, which loam serve keeps in the file token of its data dir (%s by default)",
			client.EnvToken, filepath.Join(client.DefaultDataDir, "token"))
		if strings.HasPrefix(os.Getenv(client.EnvToken), api.KeyPrefix) {
			msg = fmt.Sprintf("missing or wrong token: the API key in %s is revoked, expired, or of an org that was deleted", client.EnvToken)
		}
	}
	if errors.Is(err, client.ErrStreamEnded) {
		msg = client.ErrStreamEnded.Error() + ": " + msg
	}
	return msg
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print loam's version",
		Long: `Print this binary's version (as loam --version does): the one its build
was given (scripts/setup gives git describe's), else its module's version or
git commit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(a.stdout, "loam %s\n", version.String())
			return err
		},
	}
}
