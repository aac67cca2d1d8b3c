package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Start a detachable session, follow it, and attach again from where the
// output was when a checkpoint interrupted the attach. (test/ runs
// Example_sessions and Example_sessionsResume against a real daemon.)
func ExampleClient_Attach() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ss, err := c.CreateSession(ctx, "scratch", api.ExecRequest{Cmd: []string{"make", "test"}})
	if err != nil {
		log.Fatal(err)
	}
	// The offset reached in each stream: where to attach again.
	var got, gotErr int64
	for {
		code, err := c.Attach(ctx, "scratch", ss.ID, client.AttachOptions{
			Offset:       &got,
			StderrOffset: &gotErr,
			Stdout:       counter{os.Stdout, &got},
			Stderr:       counter{os.Stderr, &gotErr},
			OnOffset: func(stream byte, offset, dropped int64) {
				// The bytes that follow start here (later than asked
				// if dropped bytes wrapped out of the buffer).
				if stream == api.StreamStderr {
					gotErr = offset
				} else {
					got = offset
				}
			},
		})
		if errors.Is(err, client.ErrInterrupted) {
			continue // checkpointed or restored: the session runs on
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("exit", code)
		return
	}
}

// counter counts the bytes written through it.
type counter struct {
	w *os.File
	n *int64
}

func (c counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	*c.n += int64(n)
	return n, err
}

// Wait for a session, signal one, kill one's whole process tree.
func ExampleClient_WaitSession() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	ss, err := c.CreateSession(ctx, "scratch", api.ExecRequest{Cmd: []string{"sleep", "1000"}})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.SignalSession(ctx, "scratch", ss.ID, "TERM"); err != nil {
		log.Fatal(err)
	}
	done, err := c.WaitSession(ctx, "scratch", ss.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.State, *done.ExitCode) // exited 143
	if err := c.DeleteSession(ctx, "scratch", ss.ID); err != nil {
		log.Fatal(err)
	}
}
