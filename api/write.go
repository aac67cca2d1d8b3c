package api

import (
	"encoding/json"
	"errors"
	"net/http"
)

// WriteJSON answers with status and v as JSON. A failed write means the
// client went away: there is nobody left to tell.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError answers with the API's error body for err. An err that wraps
// an *Error is the user's to read and is sent as it is; any other is sent
// as a bare internal error, so that its details never leak. The caller
// logs what it must: it alone knows the request.
func WriteError(w http.ResponseWriter, err error) {
	var ae *Error
	if !errors.As(err, &ae) {
		ae = Errorf(CodeInternal, "internal error")
	}
	WriteJSON(w, ae.Code.HTTPStatus(), ErrorBody{Error: ae})
}
