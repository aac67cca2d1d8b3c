package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"loam.dev/loam/internal/runtime"
)

// imageAgentFile is the file in a memory image directory that names the
// agent binary the image's processes were started from. The image maps
// that binary's pages rather than holding them, and a restore reads them
// from the file mounted at runtime.AgentPath then: it must be the same
// binary, not the one an upgrade put in its place.
const imageAgentFile = "loam-agent"

// agentBinary is the host file container id's agent runs from: the source
// of its spec's mount at runtime.AgentPath, from runsc's state file.
func (r *Runtime) agentBinary(id string) (string, error) {
	b, err := os.ReadFile(r.stateFile(id))
	if err != nil {
		return "", err
	}
	var st struct {
		Spec *specs.Spec `json:"spec"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return "", fmt.Errorf("decoding runsc's state of %s: %w", id, err)
	}
	if st.Spec != nil {
		for _, m := range st.Spec.Mounts {
			if m.Destination == runtime.AgentPath {
				return m.Source, nil
			}
		}
	}
	return "", fmt.Errorf("no agent binary in the spec of %s", id)
}

// noteAgent writes agent, the binary container id's agent runs from, into
// its memory image in imageDir. An image without the note restores with
// the agent binary of the day, as images made before loam kept them did.
func (r *Runtime) noteAgent(id, imageDir, agent string) {
	if agent == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(imageDir, imageAgentFile), []byte(agent+"\n"), 0o600); err != nil {
		r.log.Warn("noting the agent binary of a memory image", "container", id, "image", imageDir, "err", err)
	}
}

// imageAgent is the agent binary the memory image in imageDir was made
// with, or "" when the image does not say or the binary is gone.
func (r *Runtime) imageAgent(imageDir string) string {
	b, err := os.ReadFile(filepath.Join(imageDir, imageAgentFile))
	if err != nil {
		return ""
	}
	agent := strings.TrimSpace(string(b))
	if st, err := os.Stat(agent); err != nil || !st.Mode().IsRegular() || !filepath.IsAbs(agent) {
		r.log.Warn("the agent binary of a memory image is gone; restoring with today's", "image", imageDir, "agent", agent)
		return ""
	}
	return agent
}
