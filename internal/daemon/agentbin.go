package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"loam.dev/loam/internal/atomicfile"
)

// agentsDir is where the data dir keeps the agent binaries its sandboxes
// run, one file per content.
const agentsDir = "agents"

// keepAgentBinary returns the copy of the agent binary at path that the
// data dir keeps by its content (agents/loam-SHA256PREFIX), making it if
// it is not there yet. A sandbox's memory image maps the binary its agent
// was started from, and a restore (wake, fork, restore, pool) reads its
// pages from the file mounted then: after an upgrade that is another
// binary, and the restored agent crashes. Each image names its copy (the
// runtime records it), so the copy must stay: they are kept, about 40 MiB
// per version a data dir has run. A binary that needs a dynamic loader is
// refused (checkStatic).
func keepAgentBinary(dataDir, path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading agent binary: %w", err)
	}
	if err := checkStatic(path, data); err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	dir := filepath.Join(dataDir, agentsDir)
	kept := filepath.Join(dir, "loam-"+hex.EncodeToString(sum[:])[:16])
	if st, err := os.Stat(kept); err == nil && st.Mode().IsRegular() {
		return kept, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("keeping agent binary: %w", err)
	}
	if err := atomicfile.WriteFile(kept, data, 0o755); err != nil {
		return "", fmt.Errorf("keeping agent binary: %w", err)
	}
	return kept, nil
}
