package fake

import (
	"context"
	"fmt"
	"io"
	"os"

	"loam.dev/loam/internal/agent"
)

// agentModeEnv, set in a child's environment, makes the test binary run as
// a fake container's init: the agent.
const agentModeEnv = "LOAM_FAKE_RUNTIME_AGENT"

// RunAgentIfChild runs the agent and exits if this process is a fake
// container's init, and returns at once otherwise. Every test binary whose
// tests start fake containers calls it first in its TestMain: the fake
// runs the test binary again as each container's agent.
//
// The agent is not served in the test process itself: its reaper collects
// every child with wait4(-1), and os/exec's Wait (the copy pool runs cp)
// would then find its child already reaped. A process of its own is also
// closer to the truth: an agent that is paused stops answering, and one
// that is deleted is gone.
func RunAgentIfChild() {
	if os.Getenv(agentModeEnv) == "" {
		return
	}
	os.Exit(agentMain())
}

// agentMain runs the real agent, configured from the environment as in a
// sandbox, until the test process goes away (its stdin, a pipe from the
// test process, ends) or it is killed.
func agentMain() int {
	os.Unsetenv(agentModeEnv)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if err := agent.Run(ctx, agent.ConfigFromEnv()); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		return 1
	}
	return 0
}
