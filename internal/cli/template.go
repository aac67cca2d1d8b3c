package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// templateCommands list, build, export, import and delete the templates
// sandboxes are made from, and size a template's warm pool.
type templateCommands struct{ *app }

func (tc *templateCommands) templatesCmd() *cobra.Command {
	cmd := tc.templateLsCmd()
	cmd.Use = "templates"
	return cmd
}

func (tc *templateCommands) templateLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the templates sandboxes can be made from",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return list(cmd.Context(), tc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Template, error) {
				return c.Templates(ctx)
			}, listing[api.Template]{
				header: []string{"NAME", "DEFAULT", "READY", "KIND", "STATE", "SIZE", "USES", "DESCRIPTION"},
				row: func(tpl *api.Template) []string {
					size := "-"
					if tpl.SizeBytes > 0 {
						size = formatBytes(tpl.SizeBytes)
					}
					kind := tpl.Kind
					if tpl.Memory {
						kind += "+memory"
					}
					return []string{tpl.Name, yesNo(tpl.Default), yesNo(tpl.Ready), orDash(kind), orDash(tpl.State), size, fmt.Sprint(tpl.Uses), tpl.Description}
				},
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the templates as a JSON array")
	return cmd
}

func (tc *templateCommands) templateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Keep checkpoints as templates, build, export and import them",
		Long: `A template is a root filesystem sandboxes are made from: a built-in one, or
a checkpoint kept under a name. A sandbox made from a memory template
(loam create --template NAME) starts with the template's processes running,
like a fork; from a disk-only one it boots fresh on a copy of its disk.`,
	}
	cmd.AddCommand(tc.templateLsCmd(), tc.templateCreateCmd(), tc.templateBuildCmd(), tc.templateRmCmd(),
		tc.templateExportCmd(), tc.templateImportCmd(), tc.templatePoolCmd())
	return cmd
}

// splitSource parses SANDBOX/CHECKPOINT.
func splitSource(from string) (string, string, error) {
	sb, cp, ok := strings.Cut(from, "/")
	if !ok || sb == "" || cp == "" {
		return "", "", fmt.Errorf("--from: want SANDBOX/CHECKPOINT, like scratch/v1, not %q", from)
	}
	return sb, cp, nil
}

func (tc *templateCommands) templateCreateCmd() *cobra.Command {
	var (
		from string
		pool int
	)
	cmd := &cobra.Command{
		Use:     "create NAME --from SANDBOX/CHECKPOINT",
		Short:   "Keep a checkpoint as a template",
		Long:    "Keep a checkpoint as a template, memory included when it has memory. The template\noutlives the sandbox and the checkpoint.",
		Example: "  loam template create warm --from scratch/v1\n  loam create web-1 --template warm",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, cp, err := splitSource(from)
			if err != nil {
				return err
			}
			c, err := tc.connect()
			if err != nil {
				return err
			}
			tpl, err := c.CreateTemplate(cmd.Context(), args[0], sb, cp, client.WithPool(pool))
			if err != nil {
				return err
			}
			fmt.Fprintln(tc.stdout, tpl.Name)
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the checkpoint to keep, as `SANDBOX/CHECKPOINT`")
	cmd.Flags().IntVar(&pool, "pool", 0, "keep a warm pool of `N` sandboxes of the template (see loam template pool)")
	_ = cmd.MarkFlagRequired("from")
	return cmd
}

func (tc *templateCommands) templateRmCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Delete templates made from checkpoints",
		Long:  "Delete templates made from checkpoints. One that a sandbox uses is refused; built-in ones cannot be deleted.",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := tc.confirm(yes, "delete template "+strings.Join(args, ", ")); err != nil {
				return err
			}
			c, err := tc.connect()
			if err != nil {
				return err
			}
			var errs []error
			for _, name := range args {
				errs = append(errs, c.DeleteTemplate(cmd.Context(), name))
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask to confirm")
	return cmd
}

func (tc *templateCommands) templateExportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export NAME > FILE",
		Short: "Write a template to stdout as one archive",
		Long: `Write a template made from a checkpoint to stdout as one archive: a
zstd-compressed tar of its disk and memory image, with a manifest and
checksums. loam template import loads it on another machine.`,
		Example: "  loam template export warm > warm.tar.zst",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f, ok := tc.stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
				return fmt.Errorf("stdout is a terminal: send the archive to a file (loam template export %s > %s.tar.zst)", args[0], args[0])
			}
			c, err := tc.connect()
			if err != nil {
				return err
			}
			_, err = c.ExportTemplate(cmd.Context(), args[0], tc.stdout)
			return err
		},
	}
	return cmd
}

func (tc *templateCommands) templateImportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "import NAME < FILE",
		Short:   "Make a template from an archive on stdin",
		Long:    "Make a template from an archive loam template export wrote. A damaged archive is refused and leaves nothing behind.",
		Example: "  loam template import warm < warm.tar.zst",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := tc.connect()
			if err != nil {
				return err
			}
			tpl, err := c.ImportTemplate(cmd.Context(), args[0], tc.stdin)
			if err != nil {
				return err
			}
			fmt.Fprintln(tc.stdout, tpl.Name)
			return nil
		},
	}
	return cmd
}

func (tc *templateCommands) templateBuildCmd() *cobra.Command {
	var (
		image, base string
		runs        []string
		services    []string
		memory      bool
	)
	cmd := &cobra.Command{
		Use:   "build NAME (--image REF | --template T) [--run CMD]... [--service NAME=CMD]... [--memory]",
		Short: "Prepare a sandbox once and keep it as a template",
		Long: `Create a sandbox from an image or a template, run each --run command in it
(sh -c, as the user loam; their output goes to this terminal), take a
checkpoint (memory and disk with --memory, so services and processes left
running start running in every sandbox made from it; else the disk), keep it
as template NAME, and delete the sandbox. A command that fails stops the build.`,
		Example: `  loam template build py --template base --run 'pip install flask' \
      --service web='python3 -m flask run --port 8080' --memory`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (image == "") == (base == "") {
				return errors.New("give one of --image or --template")
			}
			req := api.CreateSandbox{Template: base, Image: image}
			for _, s := range services {
				name, command, ok := strings.Cut(s, "=")
				if !ok || name == "" || command == "" {
					return fmt.Errorf("--service: want NAME=CMD, not %q", s)
				}
				req.Services = append(req.Services, api.Service{Name: name, Cmd: []string{"sh", "-c", command}})
			}
			c, err := tc.connect()
			if err != nil {
				return err
			}
			return tc.build(cmd.Context(), c, args[0], req, runs, memory)
		},
	}
	f := cmd.Flags()
	f.StringVar(&image, "image", "", "OCI image `REF` to start from")
	f.StringVar(&base, "template", "", "template `T` to start from")
	f.StringArrayVar(&runs, "run", nil, "command `CMD` to run (sh -c; repeatable, in order)")
	f.StringArrayVar(&services, "service", nil, "service `NAME=CMD` to run (sh -c; repeatable)")
	f.BoolVar(&memory, "memory", false, "keep memory too: processes running at the end run in every sandbox of the template")
	return cmd
}

// build runs `loam template build`. The builder sandbox is deleted however
// the build ends.
func (tc *templateCommands) build(ctx context.Context, c *client.Client, name string, req api.CreateSandbox, runs []string, memory bool) (err error) {
	fmt.Fprintf(tc.stderr, "loam: creating a sandbox to build template %s\n", name)
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return fmt.Errorf("building template %s: %w", name, err)
	}
	defer func() {
		if derr := c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); derr != nil {
			err = errors.Join(err, fmt.Errorf("deleting the builder sandbox %s: %w", sb.Name, derr))
		}
	}()
	for _, run := range runs {
		fmt.Fprintf(tc.stderr, "loam: run %s\n", run)
		code, err := c.Exec(ctx, sb.ID, client.ExecOptions{Cmd: []string{"sh", "-c", run}, Stdout: tc.stdout, Stderr: tc.stderr})
		if err != nil {
			return fmt.Errorf("building template %s: %w", name, err)
		}
		if code != 0 {
			return fmt.Errorf("building template %s: %q exited with status %d", name, run, code)
		}
	}
	fmt.Fprintf(tc.stderr, "loam: taking a checkpoint\n")
	cp, err := c.CreateCheckpoint(ctx, sb.ID, api.CreateCheckpoint{Memory: &memory, Comment: "template " + name})
	if err != nil {
		return fmt.Errorf("building template %s: %w", name, err)
	}
	tpl, err := c.CreateTemplate(ctx, name, sb.ID, cp.ID)
	if err != nil {
		return fmt.Errorf("building template %s: %w", name, err)
	}
	fmt.Fprintln(tc.stdout, tpl.Name)
	return nil
}
