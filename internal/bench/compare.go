package bench

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"
)

// Worse is how much a row's loam/raw ratio may grow from one run to the
// next before Compare calls it worse: the ratios of two runs on a busy
// machine differ by 10-20% with nothing changed.
const Worse = 1.2

// Change is one row's loam/raw ratio in an earlier run and in a later
// one. Ratios, not times, are compared: they are measured under the same
// load within each run, while the times of two runs are not.
type Change struct {
	Op     string  `json:"op"`
	MiB    int     `json:"mib"`
	Before float64 `json:"before"`
	After  float64 `json:"after"`
	// Worse is true when After is more than Worse times Before.
	Worse bool `json:"worse"`
}

// Compare returns the change of each row that has a ratio in both
// before and after, in after's order.
func Compare(before, after *Result) []Change {
	old := map[rowKey]float64{}
	for _, r := range before.Rows {
		if r.Ratio != nil {
			old[rowKey{r.Op, r.MiB}] = *r.Ratio
		}
	}
	var out []Change
	for _, r := range after.Rows {
		b, ok := old[rowKey{r.Op, r.MiB}]
		if !ok || r.Ratio == nil {
			continue
		}
		out = append(out, Change{Op: r.Op, MiB: r.MiB, Before: b, After: *r.Ratio, Worse: *r.Ratio > b*Worse})
	}
	return out
}

// WriteComparison writes the changes as a table: each row's loam/raw
// ratio before and after, the change, and WORSE where it grew by more
// than Worse allows; then how many rows got worse.
func WriteComparison(w io.Writer, changes []Change) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tMIB\tLOAM/RAW BEFORE\tLOAM/RAW AFTER\tCHANGE\t")
	worse := 0
	for _, c := range changes {
		mark := ""
		if c.Worse {
			mark = "WORSE"
			worse++
		}
		mib := "-"
		if c.MiB > 0 {
			mib = fmt.Sprint(c.MiB)
		}
		change := "-"
		if c.Before > 0 && !math.IsInf(c.After/c.Before, 0) {
			change = fmt.Sprintf("%+.0f%%", (c.After/c.Before-1)*100)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2fx\t%.2fx\t%s\t%s\n", c.Op, mib, c.Before, c.After, change, mark)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing bench comparison: %w", err)
	}
	if _, err := fmt.Fprintf(w, "%d of %d rows worse by more than %.0f%%\n", worse, len(changes), (Worse-1)*100); err != nil {
		return fmt.Errorf("writing bench comparison: %w", err)
	}
	return nil
}
