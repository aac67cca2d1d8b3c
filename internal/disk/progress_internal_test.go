package disk

import (
	"math"
	"strings"
	"testing"
)

// shareBefore is the sum of the shares of the steps before name.
func shareBefore(t *testing.T, name string) float64 {
	t.Helper()
	var sum float64
	for _, s := range debootstrapSteps {
		if s.name == name {
			return sum
		}
		sum += s.share
	}
	t.Fatalf("no step %s", name)
	return 0
}

func TestDebootstrapSharesAddUp(t *testing.T) {
	var sum float64
	for _, s := range debootstrapSteps {
		sum += s.share
	}
	if math.Abs(sum-1) > 0.005 {
		t.Errorf("the steps' shares add up to %.3f, want 1", sum)
	}
}

func TestDebootstrapProgress(t *testing.T) {
	// As debootstrap --debian-installer writes them on fd 3, cut short.
	transcript := `P: 0 100 DOWNREL
PF: Downloading Release file
P: 33 100
P: 100 100 DOWNREL
I: RETRIEVING
IF: Retrieving %s %s
P: 0 50060337 DOWNPKGS
P: 50060337 50060337 DOWNPKGS
P: 0 43650356 DOWNDEBS
P: 21825178 43650356
P: 0 43650356 DOWNDEBS
P: 1 88 EXTRACTPKGS
P: 44 88 EXTRACTPKGS
P: 5 7 NOSUCHSTEP
P: x 7 INSTCORE
P: 3 0 INSTCORE
P: 13 26 CONFBASE
P: 26 26 CONFBASE
`
	var got []float64
	debootstrapProgress(strings.NewReader(transcript), func(f float64) { got = append(got, f) })
	want := []float64{
		0.33 * 0.003, // DOWNREL at a third
		shareBefore(t, "DOWNRELSIG"),
		shareBefore(t, "DOWNPKGS"), // a step begun: the steps before it are done
		shareBefore(t, "SIZEDEBS"),
		shareBefore(t, "DOWNDEBS"),
		shareBefore(t, "DOWNDEBS") + 0.156/2, // a line with no step is of the current one
		// DOWNDEBS at 0 again is not reported: progress never goes down.
		shareBefore(t, "EXTRACTPKGS") + 0.127/88,
		shareBefore(t, "EXTRACTPKGS") + 0.127/2,
		// Unknown steps and lines that do not parse are skipped.
		shareBefore(t, "CONFBASE") + 0.072/2,
		shareBefore(t, "CONFBASE") + 0.072,
	}
	if len(got) != len(want) {
		t.Fatalf("reported %v, want %v", got, want)
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-9 {
			t.Errorf("report %d = %.5f, want %.5f (all: %v)", i, got[i], want[i], got)
		}
	}
	if last := got[len(got)-1]; math.Abs(last-1) > 0.005 {
		t.Errorf("at the end of the last step, %.3f, want 1", last)
	}
}
