package test

import (
	"context"
	"fmt"
	"io"
	"log"
	"strings"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_files is the Go example of the files API, run against a real
// daemon: watch a directory, write a file into the sandbox, read back what
// a process there made of it, and list the directory.
func Example_files() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "notes"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "notes")

	w, err := c.Watch(ctx, "notes", "/home/loam", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()

	// Written as the sandbox's user, atomically.
	if _, err := c.WriteFile(ctx, "notes", "/home/loam/in.txt", strings.NewReader("hello\n"), nil); err != nil {
		log.Fatal(err)
	}
	// The write goes to a temporary file renamed over in.txt: the watch
	// sees both; in.txt appears by the rename, as a "create".
	for {
		ev, err := w.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if ev.Path == "/home/loam/in.txt" {
			fmt.Println(ev.Type, ev.Path)
			break
		}
	}

	// A process in the sandbox reads it and writes another.
	if _, _, _, err := c.Output(ctx, "notes", "sh", "-c", "tr a-z A-Z < in.txt > out.txt"); err != nil {
		log.Fatal(err)
	}
	r, err := c.ReadFile(ctx, "notes", "/home/loam/out.txt", nil)
	if err != nil {
		log.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	fmt.Print(string(b))

	dir, err := c.ListFiles(ctx, "notes", "/home/loam", nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range dir.Entries {
		if strings.HasSuffix(e.Path, ".txt") {
			fmt.Println(e.Path, e.Type, e.Size)
		}
	}
	// Output:
	// create /home/loam/in.txt
	// HELLO
	// /home/loam/in.txt file 6
	// /home/loam/out.txt file 6
}
