package sandbox

import "testing"

// TestPortEvent: what an agent says on a port watch reaches the client
// only as a port event loam writes itself.
func TestPortEvent(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"type":"open","port":8000}`, `{"type":"open","port":8000}`},
		{`{"type":"close","port":1,"extra":"x"}`, `{"type":"close","port":1}`},
		{`{"type":"error","port":80}`, ""},
		{`{"type":"open","port":0}`, ""},
		{`{"type":"open","port":65536}`, ""},
		{`not json`, ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			if got := string(portEvent([]byte(tc.in))); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
