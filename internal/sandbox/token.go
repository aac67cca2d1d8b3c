package sandbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"loam.dev/loam/internal/store"
)

// AgentToken is the token of generation gen of sandbox id's agent, derived
// from the daemon's secret. Tokens are never stored: the store keeps only
// the generation, so a copy of the database or of a checkpoint's record
// reaches no agent. A sandbox's generation goes up after every memory
// checkpoint of it, so the token in a checkpoint's memory (which every fork
// and restore of it wakes up holding) is never the one its source answers
// to any more.
func AgentToken(secret []byte, id string, gen int) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("loam agent token\x00" + id + "\x00" + strconv.Itoa(gen)))
	return hex.EncodeToString(mac.Sum(nil))
}

// token is the token sb's agent answers to now. (One made by a loam
// that stored tokens answers to sb.LegacyAgentToken until its first
// connect hands it this one; see recoveryTokens.)
func (a *agentLink) token(sb *store.Sandbox) string {
	return AgentToken(a.m.cfg.Secret, sb.ID, sb.AgentGen)
}

// heldToken is the token the agent held when cp was taken: the one a
// restore or fork of cp wakes up holding.
func (a *agentLink) heldToken(cp *store.Checkpoint) string {
	if cp.LegacyAgentToken != "" {
		return cp.LegacyAgentToken
	}
	return AgentToken(a.m.cfg.Secret, cp.Sandbox, cp.AgentGen)
}
