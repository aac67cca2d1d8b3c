package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Print ports as programs in a sandbox open and close them, until a memory
// checkpoint or a restore of the sandbox ends the watch.
func ExampleClient_WatchPorts() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	for ev, err := range c.WatchPorts(ctx, "scratch") {
		if errors.Is(err, client.ErrStreamEnded) && errors.Is(err, api.ErrUnavailable) {
			fmt.Println("the sandbox was checkpointed or restored; watch again")
			return
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.Type, ev.Port)
	}
}

// Speak HTTP/1.0 to a server in a sandbox, over a port stream: a net.Conn
// whose other end is a connection made inside the sandbox.
func ExampleClient_DialPort() {
	ctx := context.Background()
	c, err := client.FromEnv()
	if err != nil {
		log.Fatal(err)
	}
	conn, err := c.DialPort(ctx, "scratch", 8080)
	if errors.Is(err, api.ErrNotFound) {
		log.Fatal("nothing listens on port 8080 in scratch")
	}
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		log.Fatal(err)
	}
	// The server closes the connection after its answer: io.EOF.
	if _, err := io.Copy(os.Stdout, conn); err != nil {
		log.Fatal(err)
	}
}
