//go:build unix

package cli

import (
	"os"
	"os/signal"
	"syscall"

	"loam.dev/loam/client"
)

// notifyResize sends the terminal's new size on every SIGWINCH until stop is
// called.
func notifyResize() (sizes <-chan client.WindowSize, stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGWINCH)
	out := make(chan client.WindowSize, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-sigs:
				ws, ok := windowSize()
				if !ok {
					continue
				}
				select {
				case out <- ws:
				case <-done:
					return
				}
			}
		}
	}()
	return out, func() {
		signal.Stop(sigs)
		close(done)
	}
}
