package cli

import (
	"context"
	"io"

	"loam.dev/loam/client"
)

// listing is how a list command prints what it lists: the table's header
// and one row of cells per item, in the header's order.
type listing[T any] struct {
	header []string
	row    func(*T) []string
}

// list is the skeleton every list command shares: connect, fetch the
// items, and print them as a JSON array (--json) or as a table. Arguments
// are checked before it, so a mistake is told before any connection.
func list[T any](ctx context.Context, a *app, asJSON bool, fetch func(context.Context, *client.Client) ([]T, error), l listing[T]) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	items, err := fetch(ctx, c)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(a.stdout, items)
	}
	return l.write(a.stdout, items)
}

// write prints items to w as a table.
func (l listing[T]) write(w io.Writer, items []T) error {
	t := newTable(w, l.header...)
	for i := range items {
		t.row(l.row(&items[i])...)
	}
	return t.flush()
}
