package test

import (
	"bytes"
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

// Example_exec runs commands in a sandbox from Go, against a real daemon:
// collected output, streamed output with stdin, env, a working directory
// and a user, a terminal that is resized, a signal, and a program that
// does not exist.
func Example_exec() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "shell"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "shell")

	// Output collects stdout and stderr; a command that fails is no error.
	stdout, stderr, code, err := c.Output(ctx, "shell", "sh", "-c", "echo out; echo err >&2; exit 3")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q %q exit %d\n", stdout, stderr, code)

	// Exec streams: stdin from a reader, output to writers as it comes.
	code, err = c.Exec(ctx, "shell", client.ExecOptions{
		Cmd:    []string{"sh", "-c", `echo "$(id -un) in $(pwd): $GREETING"; tr a-z A-Z`},
		Env:    map[string]string{"GREETING": "hello"},
		Dir:    "/tmp",
		User:   "root",
		Stdin:  strings.NewReader("from stdin\n"),
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", code)

	// A terminal of 24x80, resized to 40x120 once the command is ready.
	resize := make(chan client.WindowSize, 1)
	var term bytes.Buffer
	code, err = c.Exec(ctx, "shell", client.ExecOptions{
		Cmd:  []string{"sh", "-c", `stty size; trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 1; done`},
		TTY:  true,
		Rows: 24,
		Cols: 80,
		Stdout: &onOutput{w: &term, when: "ready", do: func() {
			resize <- client.WindowSize{Rows: 40, Cols: 120}
		}},
		Resize: resize,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(strings.ReplaceAll(term.String(), "\r\n", "\n")) // a terminal ends its lines with \r\n
	fmt.Println("exit", code)

	// A signal, by name, once the command is ready for it.
	signal := make(chan string, 1)
	code, err = c.Exec(ctx, "shell", client.ExecOptions{
		Cmd: []string{"sh", "-c", `trap 'echo got TERM; exit 4' TERM; echo ready; while :; do sleep 1; done`},
		Stdout: &onOutput{w: os.Stdout, when: "ready", do: func() {
			signal <- "TERM"
		}},
		Signal: signal,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", code)

	// A program that is not there is an error, not an exit code.
	_, err = c.Exec(ctx, "shell", client.ExecOptions{Cmd: []string{"no-such-program"}})
	fmt.Println("not started:", errors.Is(err, client.ErrNotStarted), errors.Is(err, api.ErrNotFound))
	// Output:
	// "out\n" "err\n" exit 3
	// root in /tmp: hello
	// FROM STDIN
	// exit 0
	// 24 80
	// ready
	// 40 120
	// exit 0
	// ready
	// got TERM
	// exit 4
	// not started: true true
}

// onOutput writes to w, and calls do once when what was written so far
// holds when.
type onOutput struct {
	w    io.Writer
	when string
	do   func()
	seen strings.Builder
}

func (o *onOutput) Write(p []byte) (int, error) {
	if o.do != nil {
		o.seen.Write(p)
		if strings.Contains(o.seen.String(), o.when) {
			o.do()
			o.do = nil
		}
	}
	return o.w.Write(p)
}
