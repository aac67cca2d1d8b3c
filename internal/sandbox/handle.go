package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// writeHandle writes sb's handle, for its network at ep.
func (mc *machine) writeHandle(sb *store.Sandbox, ep network.Endpoint) error {
	m := mc.m
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
	if err := atomicfile.Replace(filepath.Join(mc.dir(sb.ID), "handle.json"), bytes.NewReader(b), 0o600); err != nil {
		return fmt.Errorf("writing handle of %s: %w", sb.ID, err)
	}
	return nil
}
