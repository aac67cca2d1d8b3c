package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// The service commands: loam service ls|add|start|stop|restart|rm|logs
// (see api/service.go).

func (gc *guestCommands) serviceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "service",
		Aliases: []string{"services"},
		Short:   "Run supervised commands (services) in a sandbox",
		Long: `A service is a named command that the sandbox's agent keeps running: it
restarts it when it exits (always by default; on-failure or never if asked),
with a backoff of up to 30s, and keeps its output. Services are kept on the
sandbox's disk: they go with checkpoints and forks, and start again when the
sandbox boots fresh. A stopped service stays stopped until started.`,
	}
	cmd.AddCommand(
		gc.serviceLsCmd(),
		gc.serviceAddCmd(),
		gc.serviceActionCmd(api.ServiceStart, "Start a service", "Start a service (and keep it to start on the sandbox's next fresh boot)."),
		gc.serviceActionCmd(api.ServiceStop, "Stop a service", "Stop a service: SIGTERM to its process group, SIGKILL after 10s. It stays\nstopped, on the sandbox's next fresh boot too, until started."),
		gc.serviceActionCmd(api.ServiceRestart, "Restart a service", "Stop a service if it runs, and start it again."),
		gc.serviceRmCmd(),
		gc.serviceLogsCmd(),
	)
	return cmd
}

func (gc *guestCommands) serviceLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls [SANDBOX]",
		Aliases: []string{"list"},
		Short:   "List a sandbox's services",
		Args:    cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, _, err := gc.sandboxArgs(args)
			if err != nil {
				return err
			}
			return list(cmd.Context(), gc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.ServiceStatus, error) {
				return c.ListServices(ctx, sandbox)
			}, listing[api.ServiceStatus]{
				header: []string{"NAME", "STATE", "PID", "RESTARTS", "EXIT", "RESTART", "CMD"},
				row: func(s *api.ServiceStatus) []string {
					exit, pid := "", ""
					if s.ExitCode != nil {
						exit = strconv.Itoa(*s.ExitCode)
					}
					if s.PID != 0 {
						pid = strconv.Itoa(s.PID)
					}
					policy := s.Restart
					if policy == "" {
						policy = api.RestartAlways
					}
					return []string{s.Name, s.State, orDash(pid), strconv.Itoa(s.Restarts), orDash(exit), policy, strings.Join(s.Cmd, " ")}
				},
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the services as a JSON array")
	return cmd
}

func (gc *guestCommands) serviceAddCmd() *cobra.Command {
	var (
		def    api.Service
		env    []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "add [SANDBOX] NAME [flags] -- CMD [ARG...]",
		Short: "Define a service and start it",
		Long: `Define a service and start it. A service of that name already there is
stopped and replaced.`,
		Example: `  loam service add scratch web -- python3 -m http.server 8080
  loam service add scratch worker --restart on-failure -e QUEUE=jobs -- ./worker`,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash < 0 || dash == len(args) {
				return errors.New(`no command given: put it after "--"`)
			}
			sandbox, rest, err := gc.sandboxArgs(args[:dash], "NAME")
			if err != nil {
				return err
			}
			if len(rest) != 1 {
				return fmt.Errorf(`give [SANDBOX] NAME before "--", not %s`, strings.Join(args[:dash], " "))
			}
			def.Name, def.Cmd = rest[0], args[dash:]
			if def.Env, err = parseKV("env", env); err != nil {
				return err
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			s, err := c.PutService(cmd.Context(), sandbox, def)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(gc.stdout, s)
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf(`%w (put the command after "--": loam service add [SANDBOX] NAME -- CMD [ARG...])`, err)
	})
	f := cmd.Flags()
	f.StringVar(&def.Restart, "restart", "", "when to restart it: always (the default), on-failure or never")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable `KEY=VALUE` (repeatable)")
	f.StringVarP(&def.Dir, "workdir", "w", "", "working `DIR` (default: the user's home)")
	f.StringVarP(&def.User, "user", "u", "", "`USER` to run as (default: loam)")
	f.BoolVar(&asJSON, "json", false, "print the service as JSON")
	return cmd
}

func (gc *guestCommands) serviceActionCmd(action, short, long string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   action + " [SANDBOX] NAME",
		Short: short,
		Long:  long,
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, rest, err := gc.sandboxArgs(args, "NAME")
			if err != nil {
				return err
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			switch action {
			case api.ServiceStart:
				_, err = c.StartService(cmd.Context(), sandbox, rest[0])
			case api.ServiceStop:
				_, err = c.StopService(cmd.Context(), sandbox, rest[0])
			default:
				_, err = c.RestartService(cmd.Context(), sandbox, rest[0])
			}
			return err
		},
	}
	return cmd
}

func (gc *guestCommands) serviceRmCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:     "rm [SANDBOX] NAME",
		Aliases: []string{"delete"},
		Short:   "Stop a service and delete it",
		Long: `Stop a service and delete its definition. On a terminal rm asks first;
elsewhere it needs --yes.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, rest, err := gc.sandboxArgs(args, "NAME")
			if err != nil {
				return err
			}
			if err := gc.confirm(yes, fmt.Sprintf("delete service %s of %s", rest[0], sandbox)); err != nil {
				return err
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			return c.DeleteService(cmd.Context(), sandbox, rest[0])
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "delete without asking")
	return cmd
}

func (gc *guestCommands) serviceLogsCmd() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs [-f] [SANDBOX] NAME",
		Short: "Print a service's output",
		Long: `Print the output a service still holds, across its restarts (its stdout
on stdout, its stderr on stderr; 1 MiB of each). With -f, then follow it.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sandbox, rest, err := gc.sandboxArgs(args, "NAME")
			if err != nil {
				return err
			}
			c, err := gc.connect()
			if err != nil {
				return err
			}
			err = c.ServiceLogs(cmd.Context(), sandbox, rest[0], client.ServiceLogsOptions{
				Stdout: gc.stdout, Stderr: gc.stderr, Follow: follow,
			})
			if errors.Is(err, client.ErrInterrupted) {
				return fmt.Errorf("%w; the service runs on: loam service logs -f %s %s follows it again", err, sandbox, rest[0])
			}
			return err
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output")
	return cmd
}
