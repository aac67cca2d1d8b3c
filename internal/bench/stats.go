// Package bench measures loam against raw runsc on one machine: the same
// operations (create, exec, checkpoints, restore, forks, wake) done through
// loam's API and with plain runsc commands, interleaved in one run so that
// each row's ratio compares like with like on a noisy host.
//
// Every sandbox runs a workload (Workload) holding touched, incompressible
// memory with its checksum and a ticker that records its own pauses; after
// every restore, fork and wake the bench checks that memory (Verify), so a
// fast wrong answer fails the run.
package bench

import (
	"math"
	"slices"
)

// Summary is what the tables show of a set of samples: the median and the
// extremes. A Summary of no samples has N 0 and the other fields 0.
type Summary struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// Summarize returns the Summary of samples. The median of an even number
// of samples is the mean of the two middle ones.
func Summarize(samples []float64) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Summary{N: n, Median: med, Min: s[0], Max: s[n-1]}
}

// Ratio is a / b, or NaN when either is missing.
func Ratio(a, b Summary) float64 {
	if a.N == 0 || b.N == 0 || b.Median == 0 {
		return math.NaN()
	}
	return a.Median / b.Median
}
