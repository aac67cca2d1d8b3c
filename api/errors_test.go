package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestCodes(t *testing.T) {
	tests := []struct {
		code   Code
		wire   string // never changes
		status int
	}{
		{CodeInvalid, "invalid", http.StatusBadRequest},
		{CodeUnauthorized, "unauthorized", http.StatusUnauthorized},
		{CodeForbidden, "forbidden", http.StatusForbidden},
		{CodeNotFound, "not_found", http.StatusNotFound},
		{CodeMethodNotAllowed, "method_not_allowed", http.StatusMethodNotAllowed},
		{CodeConflict, "conflict", http.StatusConflict},
		{CodeLimit, "limit", http.StatusConflict},
		{CodeUpgradeRequired, "upgrade_required", http.StatusUpgradeRequired},
		{CodeUnavailable, "unavailable", http.StatusServiceUnavailable},
		{CodeInsufficientStorage, "insufficient_storage", http.StatusInsufficientStorage},
		{CodeInternal, "internal", http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.wire, func(t *testing.T) {
			if string(tt.code) != tt.wire {
				t.Errorf("code %q, want %q", tt.code, tt.wire)
			}
			if got := tt.code.HTTPStatus(); got != tt.status {
				t.Errorf("HTTPStatus() = %d, want %d", got, tt.status)
			}
			// A body-less response of the status reads back as the code;
			// limit shares 409 with conflict, which wins.
			if got := CodeForStatus(tt.status); got != tt.code && tt.code != CodeLimit {
				t.Errorf("CodeForStatus(%d) = %q, want %q", tt.status, got, tt.code)
			}
			// The wire form comes back as an error that matches the sentinel.
			b, _ := json.Marshal(ErrorBody{Error: Errorf(tt.code, "msg")})
			var eb ErrorBody
			if err := json.Unmarshal(b, &eb); err != nil {
				t.Fatal(err)
			}
			err := fmt.Errorf("calling: %w", eb.Error)
			if !errors.Is(err, &Error{Code: Code(tt.wire)}) || errors.Is(err, ErrInternal) && tt.code != CodeInternal {
				t.Errorf("%v does not match its own code only", err)
			}
		})
	}
}

func TestSentinels(t *testing.T) {
	for _, s := range []*Error{ErrForbidden, ErrMethodNotAllowed, ErrUpgradeRequired, ErrInsufficientStorage} {
		if !errors.Is(Errorf(s.Code, "x"), s) || errors.Is(Errorf(CodeInvalid, "x"), s) {
			t.Errorf("sentinel %q matches wrongly", s.Code)
		}
	}
}
