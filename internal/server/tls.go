package server

import (
	"crypto/tls"
	"errors"
	"fmt"
)

// LoadTLS is the TLS configuration of a listener given the --tls-cert and
// --tls-key flags (PEM files): nil when neither is given, an error when
// only one is. loam serve and loam mcp --listen both take the pair.
func LoadTLS(certFile, keyFile string) (*tls.Config, error) {
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
