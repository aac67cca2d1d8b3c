package sandbox

import (
	"fmt"

	"loam.dev/loam/api"
)

// transitions lists, for each state, the states a sandbox may move to. It is
// the one place that says which changes are possible; setState refuses the
// rest as a bug, requireState refuses them as a user's mistake.
var transitions = map[api.State][]api.State{
	api.StateCreating:  {api.StateRunning, api.StateError, api.StateDeleting},
	api.StateRunning:   {api.StateRunning, api.StateStopped, api.StateSleeping, api.StateRestoring, api.StateError, api.StateDeleting},
	api.StateStopped:   {api.StateRunning, api.StateRestoring, api.StateError, api.StateDeleting},
	api.StateSleeping:  {api.StateRunning, api.StateRestoring, api.StateError, api.StateDeleting},
	api.StateRestoring: {api.StateRunning, api.StateError},
	api.StateError:     {api.StateRunning, api.StateRestoring, api.StateError, api.StateDeleting},
	api.StateDeleting:  {api.StateDeleting},
}

// canTransition reports whether a sandbox in state from may move to to.
func canTransition(from, to api.State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// requireState returns a conflict error, for the user, when the sandbox is
// not in one of the wanted states.
func requireState(name string, have api.State, want ...api.State) error {
	for _, w := range want {
		if have == w {
			return nil
		}
	}
	return api.Errorf(api.CodeConflict, "sandbox %s is %s", name, have)
}

// errTransition is a bug: code asked for a state change the table forbids.
func errTransition(id string, from, to api.State) error {
	return fmt.Errorf("sandbox %s: impossible state change %s -> %s", id, from, to)
}
