//go:build !race

package test

// raceEnabled: this package was built without -race.
const raceEnabled = false
