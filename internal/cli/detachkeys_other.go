//go:build !linux

package cli

// detachKeysMode leaves the terminal as it is here: Ctrl-P Ctrl-Q reach
// attach after Enter at best, and Ctrl-C (without --sig-proxy) detaches.
func detachKeysMode(fd int) (restore func(), err error) {
	return func() {}, nil
}
