package cli

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// orgCommands show the caller's org, and let the operator list the orgs
// and set their quotas.
type orgCommands struct{ *app }

func (oc *orgCommands) orgCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "org",
		Short: "Show your org: its quota and what it uses",
		Long: `Show the org of your token or key: for each quota, what the org uses now and
its limit ("-" for none). A call that would take the org past a limit is
refused with code limit; the operator sets them (loam orgs quota).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := oc.connect()
			if err != nil {
				return err
			}
			o, err := c.Org(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(oc.stdout, o)
			}
			fmt.Fprintf(oc.stdout, "org %s\n", o.Name)
			t := newTable(oc.stdout, "QUOTA", "USE", "LIMIT")
			for _, f := range quotaFields(o) {
				t.row(f.name, f.use, f.limit)
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the org as JSON")
	return cmd
}

func (oc *orgCommands) orgsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "orgs",
		Short: "Make, list and delete orgs, and set their quotas (the operator's)",
		Long: `The operator's commands, with the admin token of loam serve: make an org and
its first key, list the orgs with what each uses of its quota, set an
org's quota, and delete an org.`,
		Example: `  loam orgs create docs
  loam keys create docs-admin --org docs --scope admin
  loam orgs quota docs --sandboxes 20 --memory 16Gi
  loam orgs rm docs --all`,
	}
	cmd.AddCommand(oc.orgsCreateCmd(), oc.orgsLsCmd(), oc.orgsQuotaCmd(), oc.orgsRmCmd())
	return cmd
}

func (oc *orgCommands) orgsCreateCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Make an org (then its first key: loam keys create NAME --org ORG)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := oc.connect()
			if err != nil {
				return err
			}
			o, err := c.CreateOrg(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(oc.stdout, o)
			}
			fmt.Fprintln(oc.stdout, o.Name)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the org as JSON")
	return cmd
}

func (oc *orgCommands) orgsRmCmd() *cobra.Command {
	var all, yes bool
	cmd := &cobra.Command{
		Use:     "rm ORG",
		Aliases: []string{"delete"},
		Short:   "Delete an org and its keys",
		Long: `Delete an org and its keys; the calls still open with them end. An org that
still has sandboxes is refused unless --all is given: then its sandboxes
and their checkpoints are deleted too, which asks first on a terminal
(elsewhere it needs --yes). The daemon's own org (--org) is never deleted.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := oc.connect()
			if err != nil {
				return err
			}
			if all {
				if err := oc.confirm(yes, fmt.Sprintf("delete org %s with every sandbox and checkpoint in it", args[0])); err != nil {
					return err
				}
			}
			if err := c.DeleteOrg(cmd.Context(), args[0], all); err != nil {
				return err
			}
			fmt.Fprintln(oc.stdout, args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "delete everything in the org too")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "with --all, delete without asking")
	return cmd
}

func (oc *orgCommands) orgsLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List orgs, each quota as use/limit",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return list(cmd.Context(), oc.app, asJSON, func(ctx context.Context, c *client.Client) ([]api.Org, error) {
				return c.ListOrgs(ctx)
			}, listing[api.Org]{
				header: []string{"NAME", "SANDBOXES", "MEMORY", "CPUS", "DISK", "CHECKPOINTS", "POOL MEMBERS"},
				row: func(o *api.Org) []string {
					row := []string{o.Name}
					for _, f := range quotaFields(o) {
						row = append(row, f.use+"/"+f.limit)
					}
					return row
				},
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the orgs as a JSON array")
	return cmd
}

func (oc *orgCommands) orgsQuotaCmd() *cobra.Command {
	var (
		asJSON bool
		values = map[string]*string{}
	)
	cmd := &cobra.Command{
		Use:   "quota ORG",
		Short: "Set an org's quota",
		Long: `Set limits of an org's quota; the limits not named keep their value, and
"none" takes one away. Sandboxes, memory and cpus count the org's running
sandboxes (creating, running, restoring); disk counts every sandbox's disk
limit and every memory checkpoint's memory; checkpoints and pool members
count what the org has. A limit below what the org uses stops nothing: it
refuses what would add more.`,
		Example: `  loam orgs quota docs --sandboxes 20 --memory 16Gi --cpus 8
  loam orgs quota docs --memory none`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := oc.connect()
			if err != nil {
				return err
			}
			orgs, err := c.ListOrgs(cmd.Context())
			if err != nil {
				return err
			}
			var q *api.Quota
			for i := range orgs {
				if orgs[i].Name == args[0] {
					q = &orgs[i].Quota
				}
			}
			if q == nil {
				return fmt.Errorf("org %q not found (loam orgs ls lists them)", args[0])
			}
			for name, v := range values {
				if !cmd.Flags().Changed(name) {
					continue
				}
				if err := setQuotaFlag(q, name, *v); err != nil {
					return err
				}
			}
			o, err := c.SetQuota(cmd.Context(), args[0], *q)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(oc.stdout, o)
			}
			t := newTable(oc.stdout, "QUOTA", "USE", "LIMIT")
			for _, f := range quotaFields(o) {
				t.row(f.name, f.use, f.limit)
			}
			return t.flush()
		},
	}
	for _, f := range []struct{ name, help string }{
		{"sandboxes", "running sandboxes at once"},
		{"memory", "memory of the running sandboxes (512Mi, 16Gi)"},
		{"cpus", "CPUs of the running sandboxes (0.5 is half a core)"},
		{"disk", "disk the org's sandboxes and memory checkpoints hold (100Gi)"},
		{"checkpoints", "checkpoints of the org's sandboxes"},
		{"pool-members", "members the org's warm pools keep"},
	} {
		values[f.name] = cmd.Flags().String(f.name, "", f.help+`; "none" for no limit`)
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the org as JSON")
	return cmd
}

// setQuotaFlag sets the limit of q that flag name names to v ("none":
// no limit).
func setQuotaFlag(q *api.Quota, name, v string) error {
	if v == "none" {
		switch name {
		case "sandboxes":
			q.Sandboxes = nil
		case "memory":
			q.MemoryMiB = nil
		case "cpus":
			q.CPUs = nil
		case "disk":
			q.DiskMiB = nil
		case "checkpoints":
			q.Checkpoints = nil
		case "pool-members":
			q.PoolMembers = nil
		}
		return nil
	}
	count := func() (*int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--%s %q: want a whole number, 0 or more, or none", name, v)
		}
		return &n, nil
	}
	size := func() (*int, error) {
		if v == "0" {
			return new(int), nil
		}
		n, err := parseSize(v)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w, or none", name, err)
		}
		return &n, nil
	}
	var err error
	switch name {
	case "sandboxes":
		q.Sandboxes, err = count()
	case "checkpoints":
		q.Checkpoints, err = count()
	case "pool-members":
		q.PoolMembers, err = count()
	case "memory":
		q.MemoryMiB, err = size()
	case "disk":
		q.DiskMiB, err = size()
	case "cpus":
		f, perr := strconv.ParseFloat(v, 64)
		if perr != nil || f < 0 {
			return fmt.Errorf("--cpus %q: want a number of cores, 0 or more, or none", v)
		}
		q.CPUs = &f
	}
	return err
}

// quotaField is one quota of an org as the commands show it.
type quotaField struct{ name, use, limit string }

// quotaFields are o's quotas in the API's order, each its use and limit.
func quotaFields(o *api.Org) []quotaField {
	count := func(n *int) string {
		if n == nil {
			return "-"
		}
		return strconv.Itoa(*n)
	}
	size := func(n int) string {
		if n == 0 {
			return "0"
		}
		return formatMiB(n)
	}
	sizeLimit := func(n *int) string {
		if n == nil {
			return "-"
		}
		return size(*n)
	}
	cpus := "-"
	if o.Quota.CPUs != nil {
		cpus = strconv.FormatFloat(*o.Quota.CPUs, 'f', -1, 64)
	}
	u := o.Use
	return []quotaField{
		{"sandboxes", strconv.Itoa(u.Sandboxes), count(o.Quota.Sandboxes)},
		{"memory", size(u.MemoryMiB), sizeLimit(o.Quota.MemoryMiB)},
		{"cpus", strconv.FormatFloat(u.CPUs, 'f', -1, 64), cpus},
		{"disk", size(u.DiskMiB), sizeLimit(o.Quota.DiskMiB)},
		{"checkpoints", strconv.Itoa(u.Checkpoints), count(o.Quota.Checkpoints)},
		{"pool members", strconv.Itoa(u.PoolMembers), count(o.Quota.PoolMembers)},
	}
}
