// Package agentconn is the daemon's side of the connection to a sandbox's
// agent: the one mapper that turns an agent's answer into the API's error,
// the filter on the control messages an agent sends up a socket, and the
// bounds on what the daemon takes from an agent. The sandbox is not
// trusted: whatever its agent says is the sandbox's word, and it never
// chooses an API error class that loam has not chosen for it.
package agentconn

import (
	"context"
	"encoding/json"
	"errors"

	"loam.dev/loam/api"
	"loam.dev/loam/internal/agent"
)

// MessageLimit bounds one message an agent sends on an exec, attach or
// logs socket. Agents send output in frames of at most 32 KiB and small
// control messages; whatever the sandbox sends is held in the daemon's
// memory one message at a time.
const MessageLimit = 1 << 20

// MaxMessage bounds the error text of an agent passed on to a client.
const MaxMessage = 1024

// mayChoose are the error classes an agent may give a command it could not
// start: the request was wrong for this sandbox (no such user, no such
// directory) or the program is not there. Anything else an agent says is
// its own failure, not a verdict on the request.
var mayChoose = map[api.Code]bool{api.CodeInvalid: true, api.CodeNotFound: true}

// MayChoose reports whether an agent may choose code for a request it
// refused (see mayChoose).
func MayChoose(code api.Code) bool { return mayChoose[code] }

// Failed is err as the API shows it. An error that an agent answered with
// is the sandbox's word, not loam's: it becomes an internal error that
// says the sandbox's agent failed and quotes what it said, never the class
// the agent chose. Other errors are returned as they are.
func Failed(err error) error {
	var ae *agent.Error
	if err == nil || !errors.As(err, &ae) {
		return err
	}
	return api.Errorf(api.CodeInternal, "the sandbox's agent failed: %s", ae)
}

// Map is the one mapper from the outcome of a call to an agent (err, not
// nil, from a call made with ctx) to the API's error:
//   - the caller went away (ctx ended, or the call was cancelled): err, as
//     it is, for nobody reads it;
//   - no answer (a refused or broken connection): noAnswer(), loam's
//     unavailable in the relay's words;
//   - an answer: known(ae), the meaning the relay's protocol gives the
//     agent's status, in loam's words; when known is nil or says nothing
//     (nil), Failed: the agent's own failure, internal, quoted.
//
// An agent's 5xx is never passed on as it is: a relay gives meaning only
// to the statuses its protocol defines.
func Map(ctx context.Context, err error, known func(*agent.Error) error, noAnswer func() error) error {
	var ae *agent.Error
	if !errors.As(err, &ae) {
		if ctx.Err() != nil || errors.Is(err, context.Canceled) {
			return err
		}
		return noAnswer()
	}
	if known != nil {
		if e := known(ae); e != nil {
			return e
		}
	}
	return Failed(err)
}

// Control passes an agent's control message on to the client, unless it
// is an "error" the agent has no business choosing the class of: that
// becomes an internal error that quotes what the agent said. What goes on
// is the message as loam reads it, written anew, never the agent's bytes:
// a client that reads JSON another way (case-sensitive keys, the first of
// two equal keys, fields of the wrong type skipped) must see what was
// checked here. A text message that is no control message is dropped
// (nil).
func Control(data []byte) []byte {
	var c api.ExecControl
	if json.Unmarshal(data, &c) != nil {
		return nil
	}
	if c.Type != api.ExecError || c.Error != nil && mayChoose[c.Error.Code] && len(c.Error.Message) <= MaxMessage {
		out, _ := json.Marshal(c)
		return out
	}
	said := ""
	if c.Error != nil {
		said = string(c.Error.Code) + ": " + c.Error.Message
	}
	if len(said) > MaxMessage {
		said = said[:MaxMessage] + "…"
	}
	c.Error = api.Errorf(api.CodeInternal, "the sandbox's agent failed: %q", said)
	out, _ := json.Marshal(c)
	return out
}
