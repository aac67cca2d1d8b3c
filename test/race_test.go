//go:build race

package test

// raceEnabled: this package was built with -race, so the daemon it runs is
// built with -race too (see daemonBin).
const raceEnabled = true
