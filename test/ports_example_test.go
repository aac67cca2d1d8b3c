package test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"

	"loam.dev/loam/api"
	"loam.dev/loam/client"
)

// Example_ports is the Go example of ports, run against a real daemon:
// watch a sandbox's ports, see a web server open one, and GET a page
// through a port stream (client.DialPort), as `loam port-forward` does.
func Example_ports() {
	ctx := context.Background()
	c, err := client.FromEnv() // LOAM_API_URL and LOAM_TOKEN
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, api.CreateSandbox{Name: "site", Template: "base"}); err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, "site")

	// The watch starts with the ports open now (none), then says what
	// opens and closes.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	opened := make(chan int)
	go func() {
		for ev, err := range c.WatchPorts(wctx, "site") {
			if err != nil {
				log.Print(err)
				return
			}
			if ev.Type == api.PortOpen {
				opened <- ev.Port
			}
		}
	}()
	_, _, _, err = c.Output(ctx, "site", "sh", "-c", `mkdir -p www && echo hello > www/index.html &&
		nohup python3 -m http.server 8080 --bind 127.0.0.1 --directory www >/dev/null 2>&1 &`)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("open", <-opened)

	ports, err := c.ListPorts(ctx, "site")
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range ports {
		fmt.Println(p.Port, p.Addresses, "loopback:", p.Loopback)
	}

	// Every connection of this HTTP client is a port stream into the
	// sandbox: loopback-only servers are reachable too.
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return c.DialPort(ctx, "site", 8080)
		},
	}}
	resp, err := hc.Get("http://site/")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(resp.Status, " ", string(body))
	// Output:
	// open 8080
	// 8080 [127.0.0.1] loopback: true
	// 200 OK hello
}
