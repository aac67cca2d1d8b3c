//go:build !race

package harness

// RaceEnabled: this package was built without -race.
const RaceEnabled = false
