package api

// MaxPoolSize is the most members one warm pool may keep.
const MaxPoolSize = 64

// CheckPoolSize refuses a pool size the API does not allow.
func CheckPoolSize(size int) error {
	if size < 0 || size > MaxPoolSize {
		return Errorf(CodeInvalid, "size: %d; a pool keeps 0 to %d sandboxes", size, MaxPoolSize)
	}
	return nil
}

// Pool is a warm pool: sandboxes the daemon keeps restored from a
// checkpoint, or booted from a template, ready for a fork or create that
// matches to claim one. A claimed member takes the request's name, labels,
// env, network and secrets and answers at once; the daemon makes another
// in the background. Members are not sandboxes of the API: they are not
// listed, and they cost host memory only (reported here).
type Pool struct {
	// From is the checkpoint the members are forks of; Template the
	// template they are made from. One of the two is set.
	From     *ForkSource `json:"from,omitempty"`
	Template string      `json:"template,omitempty"`
	// Size is how many members the pool keeps; 0 is no pool.
	Size int `json:"size"`
	// Ready members wait to be claimed; Starting ones are being made.
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
	// MemoryBytes is the host memory the ready members hold.
	MemoryBytes int64 `json:"memory_bytes"`
	// Claimed counts the forks and creates that took a member since the
	// daemon started.
	Claimed int `json:"claimed"`
	// Held says why the pool is below its size and not filling, when it
	// is not: host memory is short (a pool never takes memory user work
	// needs), or making a member failed (the error).
	Held string `json:"held,omitempty"`
}

// SetPool is the body of PUT …/pool: how many members to keep (0 drains
// the pool and removes it).
type SetPool struct {
	Size int `json:"size"`
}
