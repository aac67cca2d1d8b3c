package daemon

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// TestServeDebug checks that the profiles are served on loopback only:
// they carry no token check.
func TestServeDebug(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "10.1.2.3:0", "example.com:0", "nonsense"} {
		d := &Daemon{cfg: Config{DebugListen: addr}, log: slog.New(slog.DiscardHandler)}
		if err := d.serveDebug(t.Context()); err == nil {
			d.Close()
			t.Errorf("--debug-listen %s was taken", addr)
		}
	}
	d := &Daemon{cfg: Config{DebugListen: "127.0.0.1:0"}, log: slog.New(slog.DiscardHandler)}
	// serveDebug names its address in the log; read it from the listener.
	var logged strings.Builder
	d.log = slog.New(slog.NewTextHandler(&logged, nil))
	if err := d.serveDebug(t.Context()); err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			d.Close()
		}
	}()
	_, addr, ok := strings.Cut(logged.String(), "addr=")
	if !ok {
		t.Fatalf("no address logged: %s", logged.String())
	}
	resp, err := http.Get(strings.TrimSpace(addr) + "goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(body), "goroutine profile: total ") {
		t.Errorf("goroutine profile: %.80q", body)
	}
	// Close ends it with the daemon's other components.
	closed = true
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	http.DefaultClient.CloseIdleConnections()
	if resp, err := http.Get(strings.TrimSpace(addr) + "goroutine?debug=1"); err == nil {
		resp.Body.Close()
		t.Error("the profiles are still served after Close")
	}
}
