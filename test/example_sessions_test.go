package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_sessions runs every session call of the Go client against a real
// daemon: start a detachable session, list it, attach to it with input,
// wait for it, signal one, kill one's whole tree.
func Example_sessions() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "sessions"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "sessions")

	// A detachable session runs with no client attached.
	ss, err := c.CreateSession(ctx, "sessions", api.ExecRequest{
		Cmd:   []string{"sh", "-c", "echo ready; read name; echo hello $name; exit 3"},
		Stdin: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	list, err := c.ListSessions(ctx, "sessions")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(list), list[0].ID == ss.ID, list[0].State, list[0].Detachable)

	// Attach: the buffered output, then live output; stdin goes to the
	// command. Attach returns its exit code.
	code, err := c.Attach(ctx, "sessions", ss.ID, client.AttachOptions{
		Stdin:  strings.NewReader("loam\n"),
		Stdout: os.Stdout,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", code)
	done, err := c.WaitSession(ctx, "sessions", ss.ID)
	if err != nil {
		log.Fatal(err)
	}
	got, err := c.GetSession(ctx, "sessions", ss.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.State, *done.ExitCode, got.State)

	// A signal goes to the session's process group; DELETE kills its tree.
	sleeper, err := c.CreateSession(ctx, "sessions", api.ExecRequest{Cmd: []string{"sleep", "1000"}})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.SignalSession(ctx, "sessions", sleeper.ID, "TERM"); err != nil {
		log.Fatal(err)
	}
	done, err = c.WaitSession(ctx, "sessions", sleeper.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sleep", *done.ExitCode)
	if err := c.DeleteSession(ctx, "sessions", sleeper.ID); err != nil {
		log.Fatal(err)
	}
	_, err = c.GetSession(ctx, "sessions", sleeper.ID)
	fmt.Println(errors.Is(err, api.ErrNotFound))
	// Output:
	// 1 true running true
	// ready
	// hello loam
	// exit 3
	// exited 3 exited
	// sleep 143
	// true
}

// Example_sessionsResume follows a detachable session across a memory
// checkpoint, which ends the attach (ErrInterrupted) but not the session,
// and attaches again from the byte offset reached: nothing lost, nothing
// twice.
func Example_sessionsResume() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "resume"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "resume")
	ss, err := c.CreateSession(ctx, "resume", api.ExecRequest{
		Cmd: []string{"sh", "-c", "echo one; read x; echo two"}, Stdin: true,
	})
	if err != nil {
		log.Fatal(err)
	}

	pr, pw := io.Pipe()
	attached := make(chan error, 1)
	go func() {
		_, err := c.Attach(ctx, "resume", ss.ID, client.AttachOptions{Stdout: pw})
		attached <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(line)
	if _, err := c.CreateCheckpoint(ctx, "resume", api.CreateCheckpoint{}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(errors.Is(<-attached, client.ErrInterrupted))

	// Everything up to the offset reached was received.
	offset := int64(len(line))
	code, err := c.Attach(ctx, "resume", ss.ID, client.AttachOptions{
		Offset: &offset,
		Stdin:  strings.NewReader("go on\n"),
		Stdout: os.Stdout,
	})
	fmt.Println(code, err)
	// Output:
	// one
	// true
	// two
	// 0 <nil>
}
