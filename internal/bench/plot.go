package bench

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Colours of the two drivers in plots.
var (
	loamColor = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	rawColor  = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

// plotPanels are the operations that get a panel: times that depend on
// the memory size.
func plotPanels(res *Result) []string {
	var ops []string
	for _, r := range res.Rows {
		if r.Unit == UnitMS && r.MiB > 0 && !slices.Contains(ops, r.Op) {
			ops = append(ops, r.Op)
		}
	}
	return ops
}

// WritePlot draws res as an SVG: one panel per timed operation, time
// (median, with min–max bars) against memory size, loam and raw runsc.
func WritePlot(w io.Writer, res *Result) error {
	ops := plotPanels(res)
	if len(ops) == 0 {
		return fmt.Errorf("plotting the bench: no timed operation with a memory size")
	}
	const cols = 3
	rows := (len(ops) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	for i, op := range ops {
		p, err := panel(res, op)
		if err != nil {
			return err
		}
		plots[i/cols][i%cols] = p
	}
	width, height := vg.Points(300*cols), vg.Points(230*float64(rows))
	canvas := vgsvg.New(width, height)
	dc := draw.New(canvas)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(12), PadY: vg.Points(12),
		PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	for j, row := range plot.Align(plots, tiles, dc) {
		for i, c := range row {
			if plots[j][i] != nil {
				plots[j][i].Draw(c)
			}
		}
	}
	if _, err := canvas.WriteTo(w); err != nil {
		return fmt.Errorf("writing the bench plot: %w", err)
	}
	return nil
}

// errorPoints are medians with min–max bars.
type errorPoints struct {
	plotter.XYs
	plotter.YErrors
}

// panel is one operation's plot.
func panel(res *Result, op string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = op
	p.X.Label.Text = "memory (MiB)"
	p.Y.Label.Text = "ms"
	p.X.Scale = plot.LogScale{}
	p.Legend.Top = true
	p.Legend.Left = true
	var ticks []plot.Tick
	for _, drv := range []struct {
		name string
		col  color.Color
		get  func(Row) *Summary
	}{
		{"loam", loamColor, func(r Row) *Summary { return &r.Loam }},
		{"raw runsc", rawColor, func(r Row) *Summary { return r.Raw }},
	} {
		var pts errorPoints
		for _, r := range res.Rows {
			s := drv.get(r)
			if r.Op != op || s == nil || s.N == 0 || r.MiB <= 0 {
				continue
			}
			pts.XYs = append(pts.XYs, plotter.XY{X: float64(r.MiB), Y: s.Median})
			pts.YErrors = append(pts.YErrors, struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median})
			if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == float64(r.MiB) }) {
				ticks = append(ticks, plot.Tick{Value: float64(r.MiB), Label: strconv.Itoa(r.MiB)})
			}
		}
		if len(pts.XYs) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts.XYs)
		if err != nil {
			return nil, fmt.Errorf("plotting %s: %w", op, err)
		}
		line.Color, points.Color = drv.col, drv.col
		bars, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return nil, fmt.Errorf("plotting %s: %w", op, err)
		}
		bars.Color = drv.col
		p.Add(line, points, bars)
		p.Legend.Add(drv.name, line, points)
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	// A log axis needs room on both sides of a single size.
	if len(ticks) == 1 {
		p.X.Min, p.X.Max = ticks[0].Value/2, ticks[0].Value*2
	} else {
		p.X.Min, p.X.Max = p.X.Min/1.2, p.X.Max*1.2
	}
	p.Y.Min = math.Min(p.Y.Min, 0)
	return p, nil
}
