package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"loam.dev/loam/internal/bench"
)

// TestBenchFrom shows a saved result as a table, JSON, Markdown and a
// plot, measuring nothing.
func TestBenchFrom(t *testing.T) {
	raw := bench.Summary{N: 2, Median: 100, Min: 90, Max: 110}
	ratio := 1.5
	res := bench.Result{Command: "loam bench --reps 2", Reps: 2, Rows: []bench.Row{
		{Op: "fork", MiB: 64, Unit: bench.UnitMS, Loam: bench.Summary{N: 2, Median: 150, Min: 140, Max: 160}, Raw: &raw, Ratio: &ratio},
	}}
	dir := t.TempDir()
	saved := filepath.Join(dir, "res.json")
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(saved, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"table", nil, "fork       64   ms    150 (140-160)          100 (90.0-110)        1.50x"},
		{"json", []string{"--json"}, `"ratio": 1.5`},
		{"markdown", []string{"--markdown"}, "| fork | 64 | ms | 150 (140-160) | 100 (90.0-110) | 1.50x |"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, nil, "", false, nil, append([]string{"bench", "--from", saved}, tc.args...)...)
			if r.code != 0 || !strings.Contains(r.stdout, tc.want) {
				t.Errorf("code %d, stdout lacks %q:\n%s%s", r.code, tc.want, r.stdout, r.stderr)
			}
		})
	}
	// The same result compared with an earlier one whose ratio was lower.
	earlier := res
	old := 1.0
	earlier.Rows = []bench.Row{res.Rows[0]}
	earlier.Rows[0].Ratio = &old
	b, err = json.Marshal(earlier)
	if err != nil {
		t.Fatal(err)
	}
	before := filepath.Join(dir, "before.json")
	if err := os.WriteFile(before, b, 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "", false, nil, "bench", "--from", saved, "--compare", before)
	for _, want := range []string{"1.50x", "fork       64   1.00x            1.50x           +50%    WORSE", "1 of 1 rows worse"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("--compare: code %d, stdout lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}
	if r := runCLI(t, nil, "", false, nil, "bench", "--from", saved, "--compare", filepath.Join(dir, "missing.json")); r.code == 0 {
		t.Errorf("--compare with a missing file: code 0")
	}
	svg := filepath.Join(dir, "p.svg")
	if r := runCLI(t, nil, "", false, nil, "bench", "--from", saved, "--plot", svg); r.code != 0 {
		t.Fatalf("--plot: %s", r.stderr)
	}
	if b, err := os.ReadFile(svg); err != nil || !strings.Contains(string(b), "<svg") {
		t.Errorf("plot: %v %.80s", err, b)
	}
	if r := runCLI(t, nil, "", false, nil, "bench", "--ops", "teleport"); r.code == 0 || !strings.Contains(r.stderr, "teleport") {
		t.Errorf("unknown op: code %d, %s", r.code, r.stderr)
	}
}

// TestBenchGap prints the longest pause the workload recorded.
func TestBenchGap(t *testing.T) {
	dir := t.TempDir()
	since := time.Now()
	line := func(end time.Time, gap time.Duration) string {
		return strings.Join([]string{itoa(end.UnixNano()), itoa(int64(gap))}, " ") + "\n"
	}
	gaps := line(since.Add(-time.Second), 900*time.Millisecond) + line(since.Add(time.Second), 250*time.Millisecond)
	if err := os.WriteFile(filepath.Join(dir, "gaps"), []byte(gaps), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "", false, nil, "bench", "gap", "--dir", dir, "--since", itoa(since.UnixNano()))
	if r.code != 0 || strings.TrimSpace(r.stdout) != "250.000" {
		t.Errorf("bench gap: code %d, %q %s", r.code, r.stdout, r.stderr)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
