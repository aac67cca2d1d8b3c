package cli

import (
	"github.com/spf13/cobra"
)

func (a *app) templatesCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "templates",
		Short: "List the templates sandboxes can be made from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			tpls, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, tpls)
			}
			t := newTable(a.stdout, "NAME", "DEFAULT", "READY", "DESCRIPTION")
			for _, tpl := range tpls {
				t.row(tpl.Name, yesNo(tpl.Default), yesNo(tpl.Ready), tpl.Description)
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the templates as a JSON array")
	return cmd
}
