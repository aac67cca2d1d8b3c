package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"strings"

	"loam.dev/loam/client"
)

// Write a file into a sandbox, read it back, and list its directory. Paths
// are the sandbox's own; the file is written as the sandbox's user, loam.
func ExampleClient_WriteFile() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, "scratch", "/home/loam/notes/hello.txt", strings.NewReader("hello\n"), &client.FileOptions{Mode: 0o600}); err != nil {
		log.Fatal(err)
	}
	r, err := c.ReadFile(ctx, "scratch", "/home/loam/notes/hello.txt", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		log.Fatal(err)
	}
	dir, err := c.ListFiles(ctx, "scratch", "/home/loam/notes", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s%s %s\n", b, dir.Entries[0].Path, dir.Entries[0].Mode)
}

// Follow changes under a directory of a sandbox as they happen.
func ExampleClient_Watch() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	w, err := c.Watch(ctx, "scratch", "/home/loam", &client.FileOptions{Recursive: true})
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	for {
		ev, err := w.Next(ctx)
		if err != nil {
			log.Fatal(err) // io.EOF once /home/loam is gone; ErrWatchEnded after a memory checkpoint
		}
		fmt.Println(ev.Type, ev.Path)
	}
}
