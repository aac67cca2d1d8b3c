//go:build race

package harness

// RaceEnabled: this package was built with -race, so the daemon it runs is
// built with -race too (see DaemonBin).
const RaceEnabled = true
