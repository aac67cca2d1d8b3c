package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"loam.dev/loam/internal/atomicfile"
	"loam.dev/loam/internal/network"
	"loam.dev/loam/internal/store"
)

// handleVersion is bumped whenever the handle's fields change meaning, so
// that a newer daemon can read an older daemon's handles.
const handleVersion = 1

// handle is what a restarted daemon needs to take a running sandbox back:
// written next to the sandbox's bundle before it starts.
type handle struct {
	Version   int    `json:"version"`
	ID        string `json:"id"`
	Rootfs    string `json:"rootfs"`
	Netns     string `json:"netns"`
	SandboxIP string `json:"sandbox_ip"`
	AgentPort int    `json:"agent_port"`
}

func (m *Manager) writeHandle(sb *store.Sandbox, ep network.Endpoint) error {
	h := handle{
		Version: handleVersion, ID: sb.ID, Rootfs: m.disks.VolumePath(sb.ID),
		Netns: ep.Netns, SandboxIP: ep.SandboxIP.String(), AgentPort: m.cfg.AgentPort,
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return err
	}
	// Not durable: a handle serves a restarted daemon to take back sandboxes
	// that still run, and none runs after a power loss.
	if err := atomicfile.Replace(filepath.Join(m.dir(sb.ID), "handle.json"), bytes.NewReader(b), 0o600); err != nil {
		return fmt.Errorf("writing handle of %s: %w", sb.ID, err)
	}
	return nil
}

func (m *Manager) readHandle(id string) (*handle, error) {
	b, err := os.ReadFile(filepath.Join(m.dir(id), "handle.json"))
	if err != nil {
		return nil, err
	}
	var h handle
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("reading handle of %s: %w", id, err)
	}
	if h.Version > handleVersion {
		return nil, fmt.Errorf("handle of %s has version %d, newer than this daemon's %d", id, h.Version, handleVersion)
	}
	return &h, nil
}
