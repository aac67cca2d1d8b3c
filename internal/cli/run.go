package cli

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Exit statuses of `loam run` when the command could not be started, as a
// shell reports them.
const (
	exitNotFound   = 127
	exitNotStarted = 126
)

func (lc *sandboxCommands) runCmd() *cobra.Command {
	var (
		opts client.ExecOptions
		env  []string
	)
	cmd := &cobra.Command{
		Use:   "run SANDBOX [flags] -- CMD [ARG...]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox, with this process's stdin, stdout and stderr,
and exit with its exit status (127 when it isn't found). Put the command after
"--" so its flags aren't taken for run's. Give </dev/null when the command
should not read your terminal. With -t the command gets a terminal of this
terminal's size.`,
		Example: `  loam run scratch -- sh -c 'cat /home/loam/state.txt' </dev/null
  loam run -t scratch -- bash`,
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, command, err := splitRunArgs(args, cmd.ArgsLenAtDash())
			if err != nil {
				return err
			}
			opts.Cmd = command
			if opts.Env, err = parseKV("env", env); err != nil {
				return err
			}
			opts.Stdin, opts.Stdout, opts.Stderr = lc.stdin, lc.stdout, lc.stderr
			c, err := lc.connect()
			if err != nil {
				return err
			}
			if lc.localTerminal {
				detach, err := attachTerminal(&opts)
				if err != nil {
					return err
				}
				defer detach()
			}
			code, err := c.Exec(cmd.Context(), sandbox, opts)
			switch {
			case errors.Is(err, client.ErrNotStarted) && errors.Is(err, api.ErrNotFound):
				return &ExitError{Code: exitNotFound, Err: err}
			case errors.Is(err, client.ErrNotStarted):
				return &ExitError{Code: exitNotStarted, Err: err}
			case err != nil:
				return err
			case code != 0:
				return &ExitError{Code: code}
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf(`%w (put the command after "--": loam run SANDBOX -- CMD [ARG...])`, err)
	})
	f := cmd.Flags()
	f.BoolVarP(&opts.TTY, "tty", "t", false, "give the command a terminal (this terminal goes into raw mode)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable `KEY=VALUE` (repeatable)")
	f.StringVarP(&opts.Dir, "workdir", "w", "", "working `DIR` (default: the user's home)")
	f.StringVarP(&opts.User, "user", "u", "", "`USER` to run as (default: loam)")
	return cmd
}

// splitRunArgs separates the sandbox from the command. dash is the number of
// arguments before "--", or -1 without one.
func splitRunArgs(args []string, dash int) (sandbox string, command []string, err error) {
	switch {
	case len(args) == 0 || dash == 0:
		return "", nil, errors.New("no sandbox given")
	case dash > 1:
		return "", nil, fmt.Errorf(`run takes one sandbox before "--", not %s`, strings.Join(args[:dash], " "))
	case len(args) == 1:
		return "", nil, errors.New(`no command given: put it after "--"`)
	}
	return args[0], args[1:], nil
}

// attachTerminal connects this process's terminal to the command. With a
// TTY: raw mode (so keys such as Ctrl-C reach the command as bytes), the
// window size and its changes. Without: SIGINT and SIGTERM are forwarded to
// the command instead of ending loam, so the command decides how to stop and
// its exit status still comes back. The function returned undoes it all.
func attachTerminal(opts *client.ExecOptions) (detach func(), err error) {
	var undo []func()
	detach = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	if opts.TTY {
		in := int(os.Stdin.Fd())
		if term.IsTerminal(in) {
			state, err := term.MakeRaw(in)
			if err != nil {
				return nil, fmt.Errorf("putting the terminal in raw mode: %w", err)
			}
			undo = append(undo, func() { _ = term.Restore(in, state) })
		}
		if ws, ok := windowSize(); ok {
			opts.Rows, opts.Cols = ws.Rows, ws.Cols
		}
		resize, stop := notifyResize()
		opts.Resize = resize
		undo = append(undo, stop)
		return detach, nil
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	names := make(chan string, 4)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case s := <-sigs:
				name := "TERM"
				if s == os.Interrupt {
					name = "INT"
				}
				select {
				case names <- name:
				case <-done:
					return
				}
			}
		}
	}()
	opts.Signal = names
	undo = append(undo, func() {
		signal.Stop(sigs)
		close(done)
	})
	return detach, nil
}

// windowSize is the size of this process's terminal, if it has one.
func windowSize() (client.WindowSize, bool) {
	for _, f := range []*os.File{os.Stdout, os.Stdin, os.Stderr} {
		if cols, rows, err := term.GetSize(int(f.Fd())); err == nil {
			return client.WindowSize{Rows: rows, Cols: cols}, true
		}
	}
	return client.WindowSize{}, false
}
