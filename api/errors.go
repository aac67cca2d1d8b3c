package api

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is the machine-readable class of an API error. The strings never change.
type Code string

// The error codes of the API, with the HTTP status each one is sent with.
const (
	CodeInvalid          Code = "invalid"            // 400
	CodeUnauthorized     Code = "unauthorized"       // 401: no token, or the wrong one
	CodeForbidden        Code = "forbidden"          // 403: a valid token that may not do this
	CodeNotFound         Code = "not_found"          // 404
	CodeMethodNotAllowed Code = "method_not_allowed" // 405: the path exists; Allow lists its methods
	CodeConflict         Code = "conflict"           // 409
	CodeLimit            Code = "limit"              // 409, or 429 for rate limits
	CodeUpgradeRequired  Code = "upgrade_required"   // 426: a WebSocket endpoint called without the upgrade
	CodeUnavailable      Code = "unavailable"        // 503
	// CodeInsufficientStorage: there is no room for the work: the host's
	// data dir (a memory checkpoint, a fork, an upload, an image pull), or
	// a sandbox's own disk (a files call that writes, its disk_mib
	// reached). The message says which; free space and call again.
	CodeInsufficientStorage Code = "insufficient_storage" // 507
	CodeInternal            Code = "internal"             // 500
)

// Error is an API error: the body {"error":{"code":…,"message":…}}. It works
// with errors.Is against the sentinel errors below, so callers can write
// errors.Is(err, api.ErrNotFound) whatever the message.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

// ErrorBody is the JSON envelope every error response is sent in.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// Sentinel errors, one per code, for errors.Is.
var (
	ErrInvalid          = &Error{Code: CodeInvalid}
	ErrUnauthorized     = &Error{Code: CodeUnauthorized}
	ErrForbidden        = &Error{Code: CodeForbidden}
	ErrNotFound         = &Error{Code: CodeNotFound}
	ErrMethodNotAllowed = &Error{Code: CodeMethodNotAllowed}
	ErrConflict         = &Error{Code: CodeConflict}
	ErrLimit            = &Error{Code: CodeLimit}
	ErrUpgradeRequired  = &Error{Code: CodeUpgradeRequired}
	ErrUnavailable      = &Error{Code: CodeUnavailable}
	// ErrInsufficientStorage matches every insufficient_storage error.
	ErrInsufficientStorage = &Error{Code: CodeInsufficientStorage}
	ErrInternal            = &Error{Code: CodeInternal}
)

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Is reports whether target is an *Error with the same code, so that any
// error of a class matches that class's sentinel.
func (e *Error) Is(target error) bool {
	var t *Error
	if !errors.As(target, &t) {
		return false
	}
	return t.Code == e.Code
}

// Errorf makes an *Error of the given code.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// HTTPStatus is the status an error of this code is sent with.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalid:
		return http.StatusBadRequest
	case CodeUnauthorized:
		return http.StatusUnauthorized
	case CodeForbidden:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case CodeConflict, CodeLimit:
		return http.StatusConflict
	case CodeUpgradeRequired:
		return http.StatusUpgradeRequired
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeInsufficientStorage:
		return http.StatusInsufficientStorage
	default:
		return http.StatusInternalServerError
	}
}

// CodeForStatus guesses the code of a response that carried no error body.
func CodeForStatus(status int) Code {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return CodeInvalid
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusForbidden:
		return CodeForbidden
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusMethodNotAllowed:
		return CodeMethodNotAllowed
	case http.StatusConflict:
		return CodeConflict
	case http.StatusUpgradeRequired:
		return CodeUpgradeRequired
	case http.StatusTooManyRequests:
		return CodeLimit
	case http.StatusServiceUnavailable:
		return CodeUnavailable
	case http.StatusInsufficientStorage:
		return CodeInsufficientStorage
	default:
		return CodeInternal
	}
}
