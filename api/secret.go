package api

import "time"

// MaxSecretSize is the largest value a secret may hold, in bytes.
const MaxSecretSize = 64 << 10

// Secret is a secret as the API shows it: its name and times, never its
// value. No route returns a secret's value.
type Secret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PutSecret is the body of PUT /v1/secrets/{name}.
type PutSecret struct {
	Value string `json:"value"`
}

// SecretList is the body of GET /v1/secrets.
type SecretList struct {
	Secrets []Secret `json:"secrets"`
}
