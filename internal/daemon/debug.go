package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// serveDebug serves Go's profiles on cfg.DebugListen, if set: what a load
// test or an operator chasing a leak reads (goroutines, heap, open work).
// The profiles carry no token check, so the address must be loopback.
func (d *Daemon) serveDebug(ctx context.Context) error {
	addr := d.cfg.DebugListen
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--debug-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--debug-listen %q: the profiles need no token, so only a loopback address is allowed", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--debug-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	d.log.Info("serving Go's profiles", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	// A component, ended with the others: a profile taken while the daemon
	// stops may see them end.
	d.runComponents(ctx, component{"debug profiles", func(ctx context.Context) error {
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		select {
		case err := <-served:
			return err // never http.ErrServerClosed: only this closes it
		case <-ctx.Done():
			srv.Close()
			<-served
			return nil
		}
	}})
	return nil
}
