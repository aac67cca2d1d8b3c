package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Units of a Row's values.
const (
	UnitMS  = "ms"
	UnitMiB = "MiB"
)

// Result is one run of the bench: how it was made and one Row per
// operation and memory size.
type Result struct {
	// Command is the command line that made the result.
	Command string `json:"command"`
	// Started is when the run began.
	Started time.Time `json:"started"`
	// Host describes the machine: CPUs, memory, kernel, runsc.
	Host string `json:"host"`
	// Reps is how many times each operation ran per size and driver.
	Reps int `json:"reps"`
	// Notes are what the run skipped, and why.
	Notes []string `json:"notes,omitempty"`
	Rows  []Row    `json:"rows"`
}

// Row is one operation at one memory size, for loam and for raw runsc.
type Row struct {
	// Op names the operation (see Ops), with a variant after a slash
	// ("create/base").
	Op string `json:"op"`
	// MiB is the workload's memory; 0 for operations without one.
	MiB  int     `json:"mib"`
	Unit string  `json:"unit"`
	Loam Summary `json:"loam"`
	// Raw is absent where runsc has no such operation.
	Raw *Summary `json:"raw,omitempty"`
	// Ratio is loam's median over raw's; absent without Raw.
	Ratio       *float64  `json:"ratio,omitempty"`
	LoamSamples []float64 `json:"loam_samples"`
	RawSamples  []float64 `json:"raw_samples,omitempty"`
}

// recorder collects samples by operation, size and driver.
type recorder struct {
	units   map[string]string
	samples map[rowKey]map[string][]float64
}

type rowKey struct {
	op  string
	mib int
}

func newRecorder() *recorder {
	return &recorder{units: map[string]string{}, samples: map[rowKey]map[string][]float64{}}
}

// add records one sample of op at mib for driver (DriverLoam or DriverRaw).
func (r *recorder) add(op string, mib int, driver, unit string, v float64) {
	k := rowKey{op, mib}
	if r.samples[k] == nil {
		r.samples[k] = map[string][]float64{}
	}
	r.samples[k][driver] = append(r.samples[k][driver], v)
	r.units[op] = unit
}

// rows returns the rows in the order of Ops, then by size.
func (r *recorder) rows() []Row {
	var rows []Row
	for k, by := range r.samples {
		row := Row{Op: k.op, MiB: k.mib, Unit: r.units[k.op], LoamSamples: by[DriverLoam], RawSamples: by[DriverRaw]}
		row.Loam = Summarize(row.LoamSamples)
		if len(row.RawSamples) > 0 {
			raw := Summarize(row.RawSamples)
			row.Raw = &raw
			if q := Ratio(row.Loam, raw); !math.IsNaN(q) {
				row.Ratio = &q
			}
		}
		rows = append(rows, row)
	}
	sort.Slice(rows, func(i, j int) bool {
		oi, oj := opOrder(rows[i].Op), opOrder(rows[j].Op)
		if oi != oj {
			return oi < oj
		}
		if rows[i].Op != rows[j].Op {
			return rows[i].Op < rows[j].Op
		}
		return rows[i].MiB < rows[j].MiB
	})
	return rows
}

// opOrder places an operation (or its variant) in the order of rowOrder.
func opOrder(op string) int {
	for i, o := range rowOrder {
		if op == o || strings.HasPrefix(op, o+"/") {
			return i
		}
	}
	return len(rowOrder)
}

// WriteJSON writes res as indented JSON. NaN never occurs in it: missing
// values are left out.
func WriteJSON(w io.Writer, res *Result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding bench result: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteTable writes res as an aligned table: one line per operation and
// size, "median (min–max)" for loam and raw, and their ratio.
func WriteTable(w io.Writer, res *Result) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tMIB\tUNIT\tLOAM median (min-max)\tRAW median (min-max)\tLOAM/RAW")
	for _, r := range res.Rows {
		raw, ratio := "-", "-"
		if r.Raw != nil {
			raw = formatSummary(*r.Raw)
		}
		if r.Ratio != nil {
			ratio = fmt.Sprintf("%.2fx", *r.Ratio)
		}
		mib := "-"
		if r.MiB > 0 {
			mib = fmt.Sprint(r.MiB)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Op, mib, r.Unit, formatSummary(r.Loam), raw, ratio)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing bench table: %w", err)
	}
	for _, n := range res.Notes {
		if _, err := fmt.Fprintf(w, "note: %s\n", n); err != nil {
			return fmt.Errorf("writing bench table: %w", err)
		}
	}
	return nil
}

// WriteMarkdown writes res as a Markdown table, for docs/performance.md.
func WriteMarkdown(w io.Writer, res *Result) error {
	var b strings.Builder
	b.WriteString("| operation | MiB | unit | loam median (min–max) | raw runsc median (min–max) | loam/raw |\n|---|---|---|---|---|---|\n")
	for _, r := range res.Rows {
		raw, ratio, mib := "–", "–", "–"
		if r.Raw != nil {
			raw = formatSummary(*r.Raw)
		}
		if r.Ratio != nil {
			ratio = fmt.Sprintf("%.2fx", *r.Ratio)
		}
		if r.MiB > 0 {
			mib = fmt.Sprint(r.MiB)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.Op, mib, r.Unit, formatSummary(r.Loam), raw, ratio)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func formatSummary(s Summary) string {
	if s.N == 0 {
		return "-"
	}
	if s.N == 1 {
		return formatValue(s.Median)
	}
	return fmt.Sprintf("%s (%s-%s)", formatValue(s.Median), formatValue(s.Min), formatValue(s.Max))
}

// formatValue shows a value with the precision that means something at
// its size: whole numbers from 100 up.
func formatValue(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 1 || v == 0:
		return fmt.Sprintf("%.2f", v)
	default:
		// Three significant digits: a fork's own disk is a few KiB.
		return fmt.Sprintf("%.3g", v)
	}
}
