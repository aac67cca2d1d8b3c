package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
)

// IdentityDir is where, inside a sandbox, the agent keeps what programs in
// it need to call loam about their own sandbox. The files have the names the
// CLI reads from a daemon's data dir (api_url, token), so the in-sandbox CLI
// finds them with no set-up, plus sandbox (the id) and sandbox_name.
const IdentityDir = "/var/lib/loam"

// AgentBinaryPath is where the agent's binary is mounted in every sandbox
// (runtime.AgentPath).
const AgentBinaryPath = "/.loam/loam"

// Identity tells a sandbox's agent which sandbox it is and where that
// sandbox's own API is. The daemon sends it after every boot, restore and
// fork: a fork wakes up with its source's identity in memory and on disk.
type Identity struct {
	SandboxID   string `json:"sandbox_id"`
	SandboxName string `json:"sandbox_name"`
	// APIURL and APIToken reach the in-sandbox API, which acts on this
	// sandbox only.
	APIURL   string `json:"api_url"`
	APIToken string `json:"api_token"`
}

func (h *handler) serveIdentity(w http.ResponseWriter, r *http.Request) {
	var id Identity
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8192)).Decode(&id); err != nil || id.SandboxID == "" {
		writeError(w, fmt.Errorf("bad identity: %w", err))
		return
	}
	if err := writeIdentity(h.identityDir, id); err != nil {
		h.log.Error("writing identity", "err", err)
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeIdentity writes each file whole (write, then rename), so a program
// reading one never sees half of it.
func writeIdentity(dir string, id Identity) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing identity: %w", err)
	}
	files := map[string]string{
		"api_url":      id.APIURL + "\n",
		"token":        id.APIToken + "\n",
		"sandbox":      id.SandboxID + "\n",
		"sandbox_name": id.SandboxName + "\n",
	}
	// The in-sandbox CLI is the agent's own binary; put it on PATH.
	if _, err := os.Lstat("/usr/local/bin/loam"); os.IsNotExist(err) && dir == IdentityDir {
		_ = os.MkdirAll("/usr/local/bin", 0o755)
		_ = os.Symlink(AgentBinaryPath, "/usr/local/bin/loam")
	}
	for name, content := range files {
		path := filepath.Join(dir, name)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			return fmt.Errorf("writing identity: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("writing identity: %w", err)
		}
	}
	return nil
}

// SetIdentity tells the agent which sandbox it is (POST /identity).
func (c *Client) SetIdentity(ctx context.Context, id Identity) error {
	body, err := json.Marshal(id)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, http.MethodPost, "/identity", body)
	if err != nil {
		return fmt.Errorf("setting identity at %s: %w", c.BaseURL, err)
	}
	resp.Body.Close()
	return nil
}
