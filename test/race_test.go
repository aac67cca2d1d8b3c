//go:build race

package test

// raceEnabled: this package was built with -race, so the daemon (and the
// CLI) it runs are built with -race too.
const raceEnabled = true
