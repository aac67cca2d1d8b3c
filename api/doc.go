// Package api holds loam's wire types: the JSON bodies of the REST API, the
// frames of the exec WebSocket, and the error codes. The daemon, the Go SDK
// (package client) and the CLI all speak through these types, so a field
// added here is added everywhere at once.
package api
