package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/creack/pty"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// pullAPI answers a pull, then three reads of its progress: a quarter,
// three quarters, ready.
func pullAPI(t *testing.T) *httptest.Server {
	var gets atomic.Int64
	mux := http.NewServeMux()
	im := api.Image{ID: "im-1", Ref: "localhost:5000/app:v1", State: api.ImagePulling, Size: 4 << 20}
	mux.HandleFunc("POST /v1/images", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(im)
	})
	mux.HandleFunc("GET /v1/images/im-1", func(w http.ResponseWriter, r *http.Request) {
		v := im
		switch n := gets.Add(1); {
		case n == 1:
			v.Pulled = 1 << 20
		case n == 2:
			v.Pulled = 3 << 20
		default:
			v.State, v.Pulled = api.ImageReady, v.Size
		}
		json.NewEncoder(w).Encode(v)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestImagePullQuiet: without a terminal, pull prints the id alone.
func TestImagePullQuiet(t *testing.T) {
	r := runCLI(t, pullAPI(t), "", false, nil, "image", "pull", "localhost:5000/app:v1")
	if r.code != 0 || r.stdout != "im-1\n" || r.stderr != "" {
		t.Errorf("pull: %d, stdout %q, stderr %q; want the id alone", r.code, r.stdout, r.stderr)
	}
}

// TestImagePullProgress: on a terminal, pull draws a progress bar of the
// bytes read (on stderr) before it prints the id.
func TestImagePullProgress(t *testing.T) {
	srv := pullAPI(t)
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptmx.Close()
	var screen bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&screen, ptmx); close(done) }()
	a := &app{
		stdin: strings.NewReader(""), stdout: tty, stderr: tty,
		getenv:      func(string) string { return "" },
		connect:     func() (*client.Client, error) { return client.New(srv.URL, "tok"), nil },
		interactive: func() bool { return false },
	}
	root := newRoot(a)
	root.SetArgs([]string{"image", "pull", "localhost:5000/app:v1"})
	code := Execute(context.Background(), root)
	tty.Close()
	<-done
	out := screen.String()
	if code != 0 || !strings.Contains(out, "pulling localhost:5000/app:v1") || !strings.Contains(out, "MB") || !strings.HasSuffix(strings.TrimSpace(out), "im-1") {
		t.Errorf("pull on a terminal: code %d, screen %q; want a bar with bytes, then the id", code, out)
	}
}
