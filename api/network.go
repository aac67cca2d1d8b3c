package api

// Egress defaults of a NetworkPolicy. The strings never change.
const (
	// EgressAll: the sandbox reaches every address outside the host, except
	// those its Deny list names.
	EgressAll = "all"
	// EgressNone: the sandbox reaches only what its Allow list names.
	EgressNone = "none"
)

// NetworkPolicy is what a sandbox may reach on the network. It is enforced
// on the host, never inside the sandbox. Entries of Allow and Deny are
// IPv4 addresses ("192.0.2.7"), prefixes ("192.0.2.0/24"), host names
// ("pypi.org") or "*.domain" (every name below it); Allow wins over Deny.
// A sandbox reaches the host's own addresses or another sandbox only when
// an address or prefix in Allow names them (egress all and names never
// do); it reaches the in-sandbox API through its own host address.
type NetworkPolicy struct {
	// Egress is EgressAll (the default when empty) or EgressNone.
	Egress string   `json:"egress"`
	Allow  []string `json:"allow"`
	Deny   []string `json:"deny"`
}
