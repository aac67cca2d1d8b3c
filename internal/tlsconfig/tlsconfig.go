// Package tlsconfig reads the TLS configuration a listener of loam's is
// given on its command line. It is its own package so that the daemon and
// the CLI (loam mcp --listen) share it without the CLI importing the
// server.
package tlsconfig

import (
	"crypto/tls"
	"errors"
	"fmt"
)

// Load is the TLS configuration of a listener given the --tls-cert and
// --tls-key flags (PEM files): nil when neither is given, an error when
// only one is. loam serve and loam mcp --listen both take the pair.
func Load(certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--tls-cert and --tls-key go together: give both or neither")
	}
	if certFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}, nil
}
