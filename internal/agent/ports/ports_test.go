package ports

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"loam.dev/loam/api"
)

// Lines as gVisor's /proc/net/tcp and tcp6 write them (taken from runsc;
// 1B9F is the agent's own port, 7071, which is never listed).
const (
	gvisorTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   1: 0100007F:2329 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0        2 1 0000000000000000 0 0 0 0 -1
   2: 00000000:1B9F 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0        3 1 0000000000000000 0 0 0 0 -1
   3: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0        4 1 0000000000000000 0 0 0 0 -1
   4: 00000000:1FBB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0        5 2 0000000000000000 0 0 0 0 -1
`
	gvisorTCP6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:232A 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0        1 1 0000000000000000 0 0 0 0 -1
   1: 00000000000000000000000000000000:1FBB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0        1 1 0000000000000000 0 0 0 0 -1
`
)

// agentPort is the agent's own port (agent.DefaultPort) in the lines above.
const agentPort = 7071

func TestPorts(t *testing.T) {
	v4, err := parseProcNetTCP(strings.NewReader(gvisorTCP))
	if err != nil {
		t.Fatal(err)
	}
	v6, err := parseProcNetTCP(strings.NewReader(gvisorTCP6))
	if err != nil {
		t.Fatal(err)
	}
	got := ports(append(v4, v6...), agentPort)
	want := []api.Port{
		{Port: 8123, Addresses: []string{"0.0.0.0", "::"}, Loopback: false},
		{Port: 9001, Addresses: []string{"127.0.0.1"}, Loopback: true},
		{Port: 9002, Addresses: []string{"::1"}, Loopback: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ports:\n got %+v\nwant %+v", got, want)
	}
	if got := dialTargets(append(v4, v6...), 8123); !reflect.DeepEqual(got, []string{"127.0.0.1:8123", "[::1]:8123"}) {
		t.Fatalf("dial targets of 8123: %v", got)
	}
}

func TestParseSocketAddr(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // addr:port, "" for an error
	}{
		{"0100007F:0050", "127.0.0.1:80"},
		{"00000000:FFFF", "0.0.0.0:65535"},
		{"0000000000000000FFFF00000100007F:1F90", "127.0.0.1:8080"}, // ::ffff:127.0.0.1
		{"B80D0120000000000000000001000000:0016", "[2001:db8::1]:22"},
		{"0100007F", ""},
		{"0100007:0050", ""},
		{"0100007F:10000", ""},
		{"zz00007F:0050", ""},
	} {
		t.Run(tc.in, func(t *testing.T) {
			l, err := parseSocketAddr(tc.in)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("parsed as %v:%d, want an error", l.addr, l.port)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}

			if g := addrPort(l); g != tc.want {
				t.Fatalf("got %s, want %s", g, tc.want)
			}
		})
	}
}

func addrPort(l listener) string {
	return netip.AddrPortFrom(l.addr, uint16(l.port)).String()
}
