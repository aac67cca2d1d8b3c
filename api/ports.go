package api

// Ports: the TCP ports that programs in a sandbox listen on, and streams to
// them.
//
//	GET /v1/sandboxes/{sandbox}/ports                 PortList
//	GET /v1/sandboxes/{sandbox}/ports/watch           WebSocket of PortEvent
//	GET /v1/sandboxes/{sandbox}/ports/{port}/stream   WebSocket: one TCP connection
//
// The watch sends a text message holding a PortEvent for every port that
// starts or stops listening; its first messages are an "open" event for
// every port listening when it starts. It sees changes within a quarter of
// a second or so: a port open and closed again between two looks is missed.
//
// A port stream carries one TCP connection to the port, made inside the
// sandbox: binary messages of at most MaxPortMessage bytes carry its bytes,
// both ways (a client's WebSocket library must accept messages that large;
// coder/websocket's default read limit, 32 KiB, is too small). When the program
// closes the connection the server closes the socket with status 1000, and
// closing the socket closes the connection (there is no half close).
//
// A memory checkpoint or a restore of the sandbox closes every port stream
// and watch with status 1011; a disk-only checkpoint ends nothing. The
// agent's own port (7071) is neither listed nor reachable.

// Port is one TCP port that something in a sandbox listens on.
type Port struct {
	// Port is the TCP port number.
	Port int `json:"port"`
	// Addresses are the addresses it listens on inside the sandbox, such
	// as "0.0.0.0", "::" or "127.0.0.1".
	Addresses []string `json:"addresses"`
	// Loopback is true when every one of them is a loopback address: the
	// port is reachable through a port stream, but from nowhere else.
	Loopback bool `json:"loopback"`
}

// PortList is the body of GET /v1/sandboxes/{sandbox}/ports, by port.
type PortList struct {
	Ports []Port `json:"ports"`
}

// Types of PortEvent.
const (
	PortOpen  = "open"
	PortClose = "close"
)

// PortEvent is one message of a port watch.
type PortEvent struct {
	// Type is PortOpen when something started listening on the port,
	// PortClose when nothing listens on it any more.
	Type string `json:"type"`
	Port int    `json:"port"`
}

// MaxPortMessage is the largest message on a port stream, either way. It
// is large because each message costs the sandbox's agent system calls,
// which gVisor makes dear: 256 KiB moves two to three times as many bytes a
// second as 32 KiB (see BenchmarkPortStream).
const MaxPortMessage = 256 << 10

// MaxPort is the highest TCP port number.
const MaxPort = 65535
