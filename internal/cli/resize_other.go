//go:build !unix

package cli

import "loam.dev/loam/client"

// notifyResize has no SIGWINCH to watch here: the command keeps the size it
// started with.
func notifyResize() (sizes <-chan client.WindowSize, stop func()) {
	return nil, func() {}
}
