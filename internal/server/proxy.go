package server

import (
	"context"

	"github.com/coder/websocket"

	"loam.dev/loam/internal/sandbox"
)

// ProxyStream copies messages between a client's socket and a sandbox's stream
// until either side ends, then closes both: normally when the agent or the
// client closed normally, with 1011 and the reason when the sandbox ended
// the stream (a memory checkpoint, a restore) or the link to it broke.
func ProxyStream(ctx context.Context, client *websocket.Conn, st *sandbox.Stream) {
	defer st.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	agent := st.Agent()
	errc := make(chan error, 2)
	// Client -> agent: stdin and control. When the client goes away,
	// closing the agent's socket hangs the command up.
	go func() { errc <- pump(ctx, client, agent, nil) }()
	// Agent -> client: output, then "exit", then a normal close.
	go func() { errc <- pump(ctx, agent, client, st.FromAgent) }()
	var err error
	select {
	case err = <-errc:
		if websocket.CloseStatus(err) != websocket.StatusNormalClosure && ctx.Err() == nil {
			st.Broke() // the sandbox may have died: learn why
		}
	case <-st.Ended():
	}
	switch {
	case st.Reason() != "":
		// Release the Manager first: it waits for the stream to be let
		// go before it pauses the sandbox, and a client that does not
		// read would hold it for the whole close handshake.
		st.Close()
		client.Close(websocket.StatusInternalError, st.Reason())
	case websocket.CloseStatus(err) == websocket.StatusNormalClosure:
		// The agent finished (exit sent) or the client hung up cleanly.
		client.Close(websocket.StatusNormalClosure, "")
		agent.Close(websocket.StatusNormalClosure, "")
	case ctx.Err() != nil:
	default:
		client.Close(websocket.StatusInternalError, "the stream to the sandbox broke")
	}
}

// pump copies messages from one socket to another until either fails. A
// close received from src is passed on to dst with its status. filter, when
// not nil, rewrites each text message, or drops it by returning nil.
func pump(ctx context.Context, src, dst *websocket.Conn, filter func([]byte) []byte) error {
	for {
		typ, data, err := src.Read(ctx)
		if err != nil {
			if st := websocket.CloseStatus(err); st != -1 {
				dst.Close(st, "")
			}
			return err
		}
		if typ == websocket.MessageText && filter != nil {
			if data = filter(data); data == nil {
				continue // dropped
			}
		}
		if err := dst.Write(ctx, typ, data); err != nil {
			return err
		}
	}
}
