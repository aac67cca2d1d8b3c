package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// sandboxCommands are a sandbox's life cycle: create, list, get, update,
// delete, run, sleep and wake, its network policy and its URL. They share
// the app's client, streams and prompts through the embedded *app.
type sandboxCommands struct{ *app }

func (lc *sandboxCommands) createCmd() *cobra.Command {
	var (
		req              api.CreateSandbox
		env, labels      []string
		secrets, files   []string
		cpus             float64
		memory, diskSize string
		asJSON           bool
		net              networkFlags
	)
	cmd := &cobra.Command{
		Use:   "create [NAME]",
		Short: "Create a sandbox",
		Long: `Create a sandbox and print it once it runs. Without NAME the daemon picks
one. Resources left out get the daemon's defaults. Sizes are MiB, or like
512Mi or 2Gi (512M means 512Mi).`,
		Example: `  loam create scratch
  loam create web --template base --memory 1Gi --http-port 8080 --label owner=docs
  loam create build --egress none --allow pypi.org --allow '*.pythonhosted.org'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				req.Name = args[0]
			}
			var err error
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if req.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if req.Secrets, err = parseKV("secret", secrets); err != nil {
				return err
			}
			if req.SecretFiles, err = parseKV("secret-file", files); err != nil {
				return err
			}
			flags := cmd.Flags()
			if flags.Changed("cpus") || flags.Changed("memory") || flags.Changed("disk") {
				req.Resources = &api.Resources{CPUs: cpus}
				if flags.Changed("memory") {
					if req.Resources.MemoryMiB, err = parseSize(memory); err != nil {
						return fmt.Errorf("--memory: %w", err)
					}
				}
				if flags.Changed("disk") {
					if req.Resources.DiskMiB, err = parseSize(diskSize); err != nil {
						return fmt.Errorf("--disk: %w", err)
					}
				}
			}
			c, err := lc.connect()
			if err != nil {
				return err
			}
			req.Network = net.policy(cmd.Flags())
			// A create from an image waits for its pull: the image is
			// listed as a template named by its ref.
			from := req.Template
			if req.Image != "" {
				from = req.Image
			}
			end := lc.watchCreate(cmd.Context(), c, req.Name, from)
			sb, err := c.CreateSandbox(cmd.Context(), req)
			end()
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(lc.stdout, sb)
			}
			return writeSandbox(lc.stdout, sb)
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Template, "template", "", "template to make the sandbox from (the default template when neither this nor --image is given)")
	f.StringVar(&req.Image, "image", "", "OCI image to make the sandbox from: a registry reference or a path on the daemon's host, pulled first when it is not (see loam image)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable `KEY=VALUE` (repeatable)")
	f.StringArrayVarP(&labels, "label", "l", nil, "label `KEY=VALUE` (repeatable)")
	f.StringArrayVar(&secrets, "secret", nil, "give secret NAME as environment variable ENV: `ENV=NAME` (repeatable; see loam secret)")
	f.StringArrayVar(&files, "secret-file", nil, "give secret NAME as a file, mode 0400: `PATH=NAME` (repeatable)")
	f.Float64Var(&cpus, "cpus", 0, "CPU cores, such as 1 or 0.5")
	f.StringVar(&memory, "memory", "", "memory limit, such as 512Mi")
	f.StringVar(&diskSize, "disk", "", "disk size, such as 4Gi")
	f.StringVar(&req.Idle, "idle", "", "sleep after this long without activity, such as 10m")
	f.IntVar(&req.HTTPPort, "http-port", 0, "port the sandbox's URL forwards to, such as 8080")
	f.BoolVar(&req.Public, "public", false, "open the sandbox's URL to anyone who reaches the daemon (by default it needs a token: loam url NAME)")
	f.StringVar(&req.Recover, "recover", "", "what brings the sandbox back if its node is lost: latest-checkpoint (another node restores its latest stored checkpoint)")
	net.add(f)
	f.BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func (lc *sandboxCommands) lsCmd() *cobra.Command {
	var (
		labels []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Example: `  loam ls --label owner=docs`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			return list(cmd.Context(), lc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Sandbox, error) {
				return c.ListSandboxes(ctx, client.ListOptions{Labels: sel})
			}, listing[api.Sandbox]{
				header: []string{"NAME", "ID", "STATE", "TEMPLATE", "CREATED"},
				row: func(sb *api.Sandbox) []string {
					from := sb.Template
					if from == "" {
						from = sb.Image
					}
					return []string{sb.Name, sb.ID, string(sb.State), orDash(from), formatTime(sb.CreatedAt)}
				},
			})
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label `KEY=VALUE` (repeatable; all must match)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandboxes as a JSON array")
	return cmd
}

func (lc *sandboxCommands) getCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a sandbox",
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
				return printJSON(lc.stdout, sb)
			}
			return writeSandbox(lc.stdout, sb)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func (lc *sandboxCommands) updateCmd() *cobra.Command {
	var (
		labels        []string
		idle          string
		httpPort      int
		public        bool
		recoverPolicy string
		asJSON        bool
	)
	cmd := &cobra.Command{
		Use:   "update NAME",
		Short: "Change a sandbox's labels, idle time, HTTP port, public URL or recover policy",
		Long: `Change the settings of a sandbox that may change while it lives; what is
not given stays as it is. --label replaces every label (give --label= alone
to remove them all). The change takes effect at once and does not wake a
sleeping sandbox. Its network policy is changed with loam network set.`,
		Example: `  loam update web --public
  loam update web --public=false --http-port 3000
  loam update scratch --idle 30m --label owner=docs --label team=core`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req api.UpdateSandbox
			f := cmd.Flags()
			if f.Changed("label") {
				var kv []string
				for _, l := range labels {
					if l != "" {
						kv = append(kv, l)
					}
				}
				m, err := parseKV("label", kv)
				if err != nil {
					return err
				}
				if m == nil {
					m = map[string]string{}
				}
				req.Labels = &m
			}
			if f.Changed("idle") {
				req.Idle = &idle
			}
			if f.Changed("http-port") {
				req.HTTPPort = &httpPort
			}
			if f.Changed("public") {
				req.Public = &public
			}
			if f.Changed("recover") {
				req.Recover = &recoverPolicy
			}
			c, err := lc.connect()
			if err != nil {
				return err
			}
			sb, err := c.UpdateSandbox(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(lc.stdout, sb)
			}
			return writeSandbox(lc.stdout, sb)
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&labels, "label", "l", nil, "label `KEY=VALUE` (repeatable; replaces every label)")
	f.StringVar(&idle, "idle", "", "sleep after this long without activity, such as 10m (0: never)")
	f.IntVar(&httpPort, "http-port", 0, "port the sandbox's URL forwards to")
	f.BoolVar(&public, "public", false, "open the sandbox's URL to anyone who reaches the daemon (--public=false: only with a token)")
	f.StringVar(&recoverPolicy, "recover", "", "what brings it back if its node is lost: latest-checkpoint, or \"\" for nothing")
	f.BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	return cmd
}

func (lc *sandboxCommands) rmCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete sandboxes and their checkpoints",
		Long: `Delete sandboxes, with their disks and checkpoints. Forks made from their
checkpoints carry on. On a terminal rm asks first; elsewhere it needs --yes.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			what := "sandbox " + args[0]
			if len(args) > 1 {
				what = "sandboxes " + strings.Join(args, ", ")
			}
			if err := lc.confirm(yes, "delete "+what); err != nil {
				return err
			}
			c, err := lc.connect()
			if err != nil {
				return err
			}
			// Delete what can be deleted and report the rest, as rm(1) does.
			failed := false
			for _, name := range args {
				if err := c.DeleteSandbox(cmd.Context(), name); err != nil {
					if len(args) == 1 {
						return err
					}
					fmt.Fprintf(lc.stderr, "loam: %s\n", message(err))
					failed = true
				}
			}
			if failed {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "delete without asking")
	return cmd
}
