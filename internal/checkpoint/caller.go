package checkpoint

import (
	"context"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/store"
)

// Caller is who asks for a checkpoint operation: the sandbox's owner,
// through the API, or the sandbox itself, through its in-sandbox API. A
// sandbox is not trusted with its owner's undo points: from inside it may
// create, list, read and restore checkpoints, but delete only those it took
// itself, never an automatic one, and its restores prune only the automatic
// checkpoints that its own restores kept.
type Caller int

// The callers.
const (
	Owner  Caller = iota // the API, with the admin token
	Inside               // the sandbox itself, with its in-sandbox token
)

type callerKey struct{}

// WithCaller marks ctx as a request from c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf is the caller ctx was marked with; Owner when unmarked.
func CallerOf(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// CheckDelete refuses, as forbidden, a delete by c that c may not make.
func CheckDelete(c Caller, cp *store.Checkpoint) error {
	if c != Inside {
		return nil
	}
	if cp.Auto {
		return api.Errorf(api.CodeForbidden, "checkpoint %s is an automatic one, the owner's way to undo a restore: it can't be deleted from inside the sandbox", cp.ID)
	}
	if !cp.Inside {
		return api.Errorf(api.CodeForbidden, "checkpoint %s was taken by the sandbox's owner: from inside the sandbox you can delete only checkpoints taken from inside", cp.ID)
	}
	return nil
}

// PruneAutosBy returns the automatic checkpoints a restore by c deletes so
// that the newest keep of c's share remain: the owner's restores prune
// only the automatic checkpoints the owner's restores kept, and the
// sandbox's own restores only those its restores kept, so that neither
// pushes out the other's undo points. cps is oldest first.
func PruneAutosBy(c Caller, cps []*store.Checkpoint, keep int) []*store.Checkpoint {
	var share []*store.Checkpoint
	for _, cp := range cps {
		if cp.Inside == (c == Inside) {
			share = append(share, cp)
		}
	}
	return PruneAutos(share, keep)
}
