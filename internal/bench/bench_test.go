package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", []float64{5}, Summary{N: 1, Median: 5, Min: 5, Max: 5}},
		{"odd", []float64{9, 1, 5}, Summary{N: 3, Median: 5, Min: 1, Max: 9}},
		{"even", []float64{4, 1, 3, 10}, Summary{N: 4, Median: 3.5, Min: 1, Max: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.in...)
			if got := Summarize(tc.in); got != tc.want {
				t.Errorf("Summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
			}
			for i := range in {
				if in[i] != tc.in[i] {
					t.Fatalf("Summarize sorted its argument: %v", tc.in)
				}
			}
		})
	}
	if r := Ratio(Summary{N: 1, Median: 3}, Summary{N: 1, Median: 2}); r != 1.5 {
		t.Errorf("Ratio = %g, want 1.5", r)
	}
	if r := Ratio(Summary{N: 1, Median: 3}, Summary{}); !math.IsNaN(r) {
		t.Errorf("Ratio without raw = %g, want NaN", r)
	}
}

// sampleResult is a result with a loam-only row, a size-less row and
// two sizes of one op.
func sampleResult() *Result {
	rec := newRecorder()
	for _, v := range []float64{100, 120, 110} {
		rec.add("fork", 64, DriverLoam, UnitMS, v)
		rec.add("fork", 512, DriverLoam, UnitMS, v*3)
	}
	for _, v := range []float64{80, 90} {
		rec.add("fork", 64, DriverRaw, UnitMS, v)
		rec.add("fork", 512, DriverRaw, UnitMS, v*3)
	}
	rec.add("disk-checkpoint", 64, DriverLoam, UnitMS, 30)
	rec.add("create/base", 0, DriverLoam, UnitMS, 400)
	rec.add("create/base", 0, DriverRaw, UnitMS, 200)
	return &Result{Command: "loam bench", Reps: 3, Rows: rec.rows(), Notes: []string{"fork16 skipped"}}
}

func TestRowsOrderAndRatio(t *testing.T) {
	res := sampleResult()
	var got []string
	for _, r := range res.Rows {
		got = append(got, fmt.Sprintf("%s@%d", r.Op, r.MiB))
	}
	want := "create/base@0 disk-checkpoint@64 fork@64 fork@512"
	if strings.Join(got, " ") != want {
		t.Fatalf("rows %v, want %s", got, want)
	}
	fork := res.Rows[2]
	if fork.Loam.Median != 110 || fork.Raw == nil || fork.Raw.Median != 85 || fork.Ratio == nil || math.Abs(*fork.Ratio-110.0/85) > 1e-9 {
		t.Errorf("fork row %+v", fork)
	}
	if res.Rows[1].Raw != nil || res.Rows[1].Ratio != nil {
		t.Errorf("loam-only row has raw values: %+v", res.Rows[1])
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, sampleResult()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"OPERATION", "LOAM/RAW",
		"fork             64   ms    110 (100-120)          85.0 (80.0-90.0)      1.29x",
		"disk-checkpoint  64   ms    30.0                   -                     -",
		"note: fork16 skipped",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := WriteMarkdown(&b, sampleResult()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| fork | 512 | ms | 330 (300-360) | 255 (240-270) | 1.29x |") {
		t.Errorf("markdown:\n%s", b.String())
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, sampleResult()); err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not decode: %v\n%s", err, b.String())
	}
	if len(back.Rows) != 4 || back.Rows[2].Op != "fork" || back.Rows[2].Raw.N != 2 || len(back.Rows[2].LoamSamples) != 3 {
		t.Errorf("decoded %+v", back.Rows)
	}
	if strings.Contains(b.String(), "NaN") {
		t.Errorf("JSON holds NaN:\n%s", b.String())
	}
}

func TestWritePlot(t *testing.T) {
	var b bytes.Buffer
	if err := WritePlot(&b, sampleResult()); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	if !strings.HasPrefix(svg, "<?xml") || !strings.Contains(svg, "<svg") {
		t.Fatalf("not an SVG: %.200s", svg)
	}
	// One panel per timed op with a size: fork and disk-checkpoint, not
	// create.
	if got := plotPanels(sampleResult()); strings.Join(got, ",") != "disk-checkpoint,fork" {
		t.Errorf("panels %v", got)
	}
	if err := WritePlot(&b, &Result{}); err == nil {
		t.Error("plot of nothing: no error")
	}
}

func TestVerify(t *testing.T) {
	dir := t.TempDir()
	if err := writeBlob(dir, 2); err != nil {
		t.Fatal(err)
	}
	if err := Verify(dir); err != nil {
		t.Fatalf("fresh memory: %v", err)
	}
	// One flipped byte is a wrong answer.
	f, err := os.OpenFile(filepath.Join(dir, blobFile), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	if _, err := f.ReadAt(one, 1<<20); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0xff
	if _, err := f.WriteAt(one, 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := Verify(dir); !errors.Is(err, ErrChecksum) {
		t.Fatalf("corrupted memory: %v, want ErrChecksum", err)
	}
}

func TestParseGaps(t *testing.T) {
	base := time.Unix(1000, 0)
	in := fmt.Sprintf("%d %d\n%d %d\n%d %d\ncut", base.UnixNano()-1, int64(900*time.Millisecond),
		base.UnixNano()+5, int64(120*time.Millisecond), base.UnixNano()+9, int64(7*time.Millisecond))
	got, err := parseGaps(strings.NewReader(in), base)
	if err != nil || got != 120*time.Millisecond {
		t.Errorf("parseGaps = %v, %v; want 120ms (the earlier gap is before since)", got, err)
	}
}

func TestWorkloadRecordsGaps(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Workload(ctx, dir, 1) }()
	for {
		if _, err := os.Stat(filepath.Join(dir, readyFile)); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := Verify(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := MaxGap(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// fakeDriver is a Driver whose memory check fails once corrupt is set:
// what a restore that brought back the wrong memory looks like.
type fakeDriver struct {
	mu      sync.Mutex
	n       int
	live    map[string]bool
	corrupt bool
}

func (f *fakeDriver) Name() string         { return DriverLoam }
func (f *fakeDriver) Binary() string       { return "/loam" }
func (f *fakeDriver) HostID(string) string { return "no-such-process-" + randomHex(8) }
func (f *fakeDriver) new() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	id := fmt.Sprintf("fake-%d", f.n)
	f.live[id] = true
	return id
}
func (f *fakeDriver) Create(context.Context, string, int) (string, error) { return f.new(), nil }
func (f *fakeDriver) Exec(_ context.Context, _ string, cmd ...string) (string, error) {
	if len(cmd) > 2 && cmd[2] == "check" && f.corrupt {
		return "", fmt.Errorf("exit 1: %w", ErrChecksum)
	}
	if len(cmd) > 2 && cmd[2] == "gap" {
		return "12.5\n", nil
	}
	return "", nil
}
func (f *fakeDriver) Checkpoint(context.Context, string, bool) (string, int64, error) {
	return "cp", 1 << 20, nil
}
func (f *fakeDriver) Restore(context.Context, string, string) error        { return nil }
func (f *fakeDriver) Fork(context.Context, string, string) (string, error) { return f.new(), nil }
func (f *fakeDriver) Sleep(context.Context, string) error                  { return nil }
func (f *fakeDriver) Wake(context.Context, string) error                   { return nil }
func (f *fakeDriver) Delete(_ context.Context, box string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, box)
	return nil
}

func TestRunFailsOnChecksumMismatch(t *testing.T) {
	for _, op := range []string{"restore", "wake"} {
		t.Run(op, func(t *testing.T) {
			f := &fakeDriver{live: map[string]bool{}, corrupt: true}
			_, err := Run(context.Background(), Config{Sizes: []int{16}, Reps: 1, Ops: []string{op}, Templates: []string{"busybox"}}, []Driver{f})
			if !errors.Is(err, ErrChecksum) {
				t.Fatalf("Run = %v, want ErrChecksum", err)
			}
			if len(f.live) != 0 {
				t.Errorf("sandboxes left: %v", f.live)
			}
		})
	}
}

func TestRunRecords(t *testing.T) {
	f := &fakeDriver{live: map[string]bool{}}
	res, err := Run(context.Background(), Config{Sizes: []int{16}, Reps: 2, Ops: []string{"create", "checkpoint", "restore"}, Templates: []string{"busybox"}}, []Driver{f})
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]Row{}
	for _, r := range res.Rows {
		ops[r.Op] = r
	}
	for _, op := range []string{"create/busybox", "checkpoint", "checkpoint-pause", "checkpoint-image", "restore"} {
		if ops[op].Loam.N != 2 {
			t.Errorf("%s: %d samples, want 2", op, ops[op].Loam.N)
		}
	}
	if p := ops["checkpoint-pause"].Loam.Median; p != 12.5 {
		t.Errorf("pause %g, want 12.5", p)
	}
	if _, ok := ops["fork"]; ok {
		t.Error("fork measured though not asked for")
	}
	if len(f.live) != 0 {
		t.Errorf("sandboxes left: %v", f.live)
	}
	if err := ValidOps([]string{"fork", "teleport"}); err == nil {
		t.Error("ValidOps took teleport")
	}
}

func TestParseBtrfsDu(t *testing.T) {
	out := "     Total   Exclusive  Set shared  Filename\n 211812352     1576960   210235392  /x/volumes/sb-1\n"
	if n, err := parseBtrfsDu(out); err != nil || n != 1576960 {
		t.Errorf("parseBtrfsDu = %d, %v", n, err)
	}
	if _, err := parseBtrfsDu("ERROR: not btrfs"); err == nil {
		t.Error("no error for a failure message")
	}
}

// TestCompare compares two runs row by row, by ratio, and marks a ratio
// that grew by more than Worse allows.
func TestCompare(t *testing.T) {
	ratio := func(v float64) *float64 { return &v }
	before := &Result{Rows: []Row{
		{Op: "checkpoint", MiB: 64, Ratio: ratio(1.5)},
		{Op: "checkpoint", MiB: 512, Ratio: ratio(1.2)},
		{Op: "exec", MiB: 64, Ratio: ratio(0.6)},
		{Op: "disk-checkpoint", MiB: 64},
	}}
	after := &Result{Rows: []Row{
		{Op: "checkpoint", MiB: 64, Ratio: ratio(2.4)},
		{Op: "checkpoint", MiB: 512, Ratio: ratio(1.3)},
		{Op: "fork", MiB: 64, Ratio: ratio(1.1)},
		{Op: "disk-checkpoint", MiB: 64},
	}}
	got := Compare(before, after)
	want := []Change{
		{Op: "checkpoint", MiB: 64, Before: 1.5, After: 2.4, Worse: true},
		{Op: "checkpoint", MiB: 512, Before: 1.2, After: 1.3},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Compare = %+v, want %+v", got, want)
	}
	var b bytes.Buffer
	if err := WriteComparison(&b, got); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"checkpoint  64   1.50x            2.40x           +60%    WORSE",
		"checkpoint  512  1.20x            1.30x           +8%",
		"1 of 2 rows worse by more than 20%",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("comparison lacks %q:\n%s", line, b.String())
		}
	}
}
