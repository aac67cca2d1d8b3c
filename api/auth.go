package api

import (
	"net/http"
	"strings"
)

// BearerToken is the token of h's "Authorization: Bearer TOKEN", and
// whether it carries one. The scheme is matched in any case ("bearer",
// "BEARER"), as RFC 9110 (section 11.1) requires of every auth scheme, and
// may be followed by more than one space. It is the one parser of bearer
// tokens in loam: the daemon's API, the in-sandbox API, the URL front door
// and the agent all read them here.
func BearerToken(h http.Header) (string, bool) {
	scheme, rest, ok := strings.Cut(h.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token := strings.TrimLeft(rest, " ")
	if token == "" {
		return "", false
	}
	return token, true
}

// InsideSocketName is the name, in a sandbox's data dir (/var/lib/loam),
// of the unix socket on which the sandbox's agent serves the sandbox's own
// API to root and to the sandbox's user, who cannot read its token. The
// agent serves it and the SDK finds it, so it lives here, where both look.
const InsideSocketName = "api.sock"
